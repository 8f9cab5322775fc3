"""Pinned math, first-order algorithms: one or two hand-computed rounds of each named algorithm on
the affine model of tests/pinned/pinning.py, run through the real FederatedTrainer, against docs/algorithms.md section 2
written out with plain torch ops. Any wrong sign, scale, order (clip -> correction -> optimizer) or default fails.
The second-order seeds are in test_pinned_second_order.py, the defaults table in test_pinned_defaults.py."""

from __future__ import annotations

import pytest
import torch

from tests.pinned.pinning import B, W, assert_matches, avg, clip, federate, grad, mean_server, run

CLIP = 0.5  # below every client's first gradient norm: clipping is active where a test turns it on


def sgd_step(x, d, eta, wd):
    """torch SGD without momentum, coupled weight decay: x <- x - eta (d + wd x) (docs/algorithms.md 1.1)."""
    return {k: x[k] - eta * (d[k] + wd * x[k]) for k in x}


def test_fedavg_is_k_sgd_steps_then_the_mean_times_the_server_lr(tmp_path):
    wd, server_lr = 1e-3, 0.5  # default lr 0.1 and wd (FedPAC Table 8)

    def client(i, r, eta, x, sample):
        for _ in range(3):
            x = sgd_step(x, grad(x, i), eta, wd)
        return x

    def server(r, eta, x, finals, sample):  # x + eta_g mean Delta
        return {k: x[k] + server_lr * (avg(finals, k) - x[k]) for k in x}

    got, _ = run(tmp_path, "fedavg", rounds=2, local_steps=3, algorithm_kwargs={"server_lr": server_lr})
    assert_matches(got, federate(2, 0.1, client, server))


def test_fedavg_clips_the_raw_gradient_before_the_coupled_weight_decay(tmp_path):
    wd = 1e-3

    def client(i, r, eta, x, sample):
        for _ in range(2):
            x = sgd_step(x, clip(grad(x, i), CLIP), eta, wd)
        return x

    got, _ = run(tmp_path, "fedavg", max_grad_norm=CLIP)
    assert_matches(got, federate(1, 0.1, client, mean_server))


def test_fedprox_adds_mu_times_the_drift_after_clipping(tmp_path):
    mu, wd = 0.5, 1e-3  # a large mu so the proximal term is visible after 3 steps

    def client(i, r, eta, x, sample):
        x_r = {k: t.clone() for k, t in x.items()}
        for _ in range(3):
            g = clip(grad(x, i), CLIP)
            x = sgd_step(x, {k: g[k] + mu * (x[k] - x_r[k]) for k in x}, eta, wd)
        return x

    got, _ = run(tmp_path, "fedprox", local_steps=3, max_grad_norm=CLIP, learning_rate=0.3,
                 algorithm_kwargs={"mu": mu})
    assert_matches(got, federate(1, 0.3, client, mean_server))


@pytest.mark.parametrize("max_grad_norm", [0.0, CLIP])
def test_fedcm_mixes_the_clipped_gradient_with_last_rounds_global_direction(tmp_path, max_grad_norm):
    """d = (1 - beta) clip(g) + beta g_G, SGD on d (+ coupled wd); g_G = -mean Delta / (K eta_r), zero in round 0,
    used with the next round's eta (docs/algorithms.md 2.5, 5.2)."""
    beta, wd, K = 0.9, 1e-3, 2
    g_G = {W: torch.zeros(2, 2, dtype=torch.float64), B: torch.zeros(2, dtype=torch.float64)}

    def client(i, r, eta, x, sample):
        for _ in range(K):
            g = grad(x, i)
            g = clip(g, max_grad_norm) if max_grad_norm else g
            x = sgd_step(x, {k: (1 - beta) * g[k] + beta * g_G[k] for k in x}, eta, wd)
        return x

    def server(r, eta, x, finals, sample):
        x_next = mean_server(r, eta, x, finals, sample)
        g_G.update({k: -(x_next[k] - x[k]) / (K * eta) for k in x})
        return x_next

    got, _ = run(tmp_path, "fedcm", rounds=2, max_grad_norm=max_grad_norm)
    assert_matches(got, federate(2, 0.1, client, server))


def test_scaffold_control_variates_over_three_rounds_with_partial_participation(tmp_path):
    """g <- g - c_i + c; c_i+ = c_i - c + (x^r - x_i^K)/(K eta_r); c <- c + (1/N) sum_S Delta c_i (docs/algorithms.md
    2.4); N = 3 clients, 2 per round, so 1/N and 1/S differ and stale c_i are kept."""
    N, S, K, wd = 3, 2, 2, 1e-3
    zero = {W: torch.zeros(2, 2, dtype=torch.float64), B: torch.zeros(2, dtype=torch.float64)}
    c = dict(zero)
    c_i = {i: dict(zero) for i in range(N)}
    delta_c = {}

    def client(i, r, eta, x, sample):
        x_r = {k: t.clone() for k, t in x.items()}
        for _ in range(K):
            g = grad(x, i)
            x = sgd_step(x, {k: g[k] - c_i[i][k] + c[k] for k in x}, eta, wd)
        new = {k: c_i[i][k] - c[k] + (x_r[k] - x[k]) / (K * eta) for k in x}
        delta_c[i] = {k: new[k] - c_i[i][k] for k in x}
        c_i[i] = new
        return x

    def server(r, eta, x, finals, sample):
        for k in c.keys():
            c[k] = c[k] + sum(delta_c[i][k] for i in finals) / N
        return mean_server(r, eta, x, finals, sample)

    got, _ = run(tmp_path, "scaffold", rounds=3, num_clients=N, per_round=S, learning_rate=0.3)
    assert_matches(got, federate(3, 0.3, client, server, num_clients=N, per_round=S))


def test_fedavgm_server_momentum(tmp_path):
    """v <- beta v + D ; x <- x + eta_g v, v^0 = 0 (docs/algorithms.md 2.2); wd 1e-4 and beta 0.9 are the defaults."""
    wd, beta, server_lr = 1e-4, 0.9, 0.7
    v = {}

    def client(i, r, eta, x, sample):
        for _ in range(2):
            x = sgd_step(x, grad(x, i), eta, wd)
        return x

    def server(r, eta, x, finals, sample):
        D = {k: avg(finals, k) - x[k] for k in x}
        v.update({k: beta * v.get(k, 0.0) + D[k] for k in x})
        return {k: x[k] + server_lr * v[k] for k in x}

    got, _ = run(tmp_path, "fedavgm", rounds=3, algorithm_kwargs={"server_lr": server_lr})
    assert_matches(got, federate(3, 0.1, client, server))


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_fedopt_server_moments(tmp_path, kind):
    """m <- b1 m + (1-b1) D; v by kind; x <- x + eta_g m / (sqrt(v) + tau); m^0 = 0, v^0 = tau^2, no bias
    correction (docs/algorithms.md 2.6). Client lr 0.05, server lr 0.03, b1 0.9, b2 0.99, tau 1e-3: the defaults."""
    b1, b2, tau, server_lr = 0.9, 0.99, 1e-3, 0.03
    state = {}

    def client(i, r, eta, x, sample):
        for _ in range(2):
            x = sgd_step(x, grad(x, i), eta, 0.0)
        return x

    def server(r, eta, x, finals, sample):
        out = {}
        for k in x:
            D = avg(finals, k) - x[k]
            m = b1 * state.get("m" + k, torch.zeros_like(D)) + (1 - b1) * D
            v = state.get("v" + k, torch.full_like(D, tau ** 2))
            if kind == "adam":
                v = b2 * v + (1 - b2) * D * D
            elif kind == "yogi":
                v = v - (1 - b2) * D * D * torch.sign(v - D * D)
            else:
                v = v + D * D
            state["m" + k], state["v" + k] = m, v
            out[k] = x[k] + server_lr * m / (v.sqrt() + tau)
        return out

    got, _ = run(tmp_path, f"fed{kind}", rounds=2)
    assert_matches(got, federate(2, 0.05, client, server))


@pytest.mark.parametrize("mu", [0.9, 0.0])
def test_prefedopt_server_covariance_preconditioner(tmp_path, mu):
    """Clients: SGD momentum 0.9 by default (torch: buf <- mu buf + g, first buf = g), plain SGD (Alg. 3) with
    momentum 0. Server: D = mean Delta / K ; m <- b1 m + (1-b1) D ; P <- b2 P + (1-b2)(D - m)^2 ;
    x <- x + eta D / sqrt(P + tau) (docs/algorithms.md 2.14)."""
    K, b1, b2, tau, server_lr = 3, 0.9, 0.9, 1e-3, 0.05
    state = {}

    def client(i, r, eta, x, sample):
        buf = None
        for _ in range(K):
            g = grad(x, i)
            buf = g if buf is None else {k: mu * buf[k] + g[k] for k in x}
            x = {k: x[k] - eta * buf[k] for k in x}
        return x

    def server(r, eta, x, finals, sample):
        out = {}
        for k in x:
            D = (avg(finals, k) - x[k]) / K
            m = b1 * state.get("m" + k, torch.zeros_like(D)) + (1 - b1) * D
            P = b2 * state.get("P" + k, torch.zeros_like(D)) + (1 - b2) * (D - m) ** 2
            state["m" + k], state["P" + k] = m, P
            out[k] = x[k] + server_lr * D / (P + tau).sqrt()
        return out

    got, _ = run(tmp_path, "prefedopt", rounds=2, local_steps=K, algorithm_kwargs={} if mu == 0.9 else {"momentum": mu})
    assert_matches(got, federate(2, 0.05, client, server))


def test_local_adamw_restarts_its_state_every_round(tmp_path):
    """torch AdamW (docs/algorithms.md 1.2) with fresh m, v, t at each round start (2.1)."""
    b1, b2, eps, wd, K = 0.9, 0.999, 1e-8, 0.01, 2

    def client(i, r, eta, x, sample):
        m = {k: torch.zeros_like(t) for k, t in x.items()}
        v = {k: torch.zeros_like(t) for k, t in x.items()}
        for t in range(1, K + 1):
            g = grad(x, i)
            for k in x:
                m[k] = b1 * m[k] + (1 - b1) * g[k]
                v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
                x[k] = x[k] * (1 - eta * wd)
                x[k] = x[k] - eta * (m[k] / (1 - b1 ** t)) / ((v[k] / (1 - b2 ** t)).sqrt() + eps)
        return x

    got, _ = run(tmp_path, "local_adamw", rounds=2, learning_rate=0.05)
    assert_matches(got, federate(2, 0.05, client, mean_server))
