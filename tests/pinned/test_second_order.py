"""Pinned math, second-order seeds: two hand-computed rounds of each named algorithm on the affine
model of tests/pinned/pinning.py (W a 2 x 2 matrix, b a 1-D bias), run through the real FederatedTrainer, against
docs/algorithms.md written out with plain torch ops: the optimizer of section 1, the (1 - beta) local lr and the
correction x <- x - beta eta_r g_G after it (2.8, 2.9), what is averaged, kept or reset (4.3), the server rule."""

from __future__ import annotations

import math

import pytest
import torch

from tests.pinned.pinning import B, W, assert_matches, client_rows, federate, grad, mean_server, run

ALGO_LR = {"fedpac_muon": 3e-4, "fedmuon": 3e-4, "local_muon": 3e-4}  # their defaults (Muon lr = 100 x)


def zeros_like(x):
    return {k: torch.zeros_like(t) for k, t in x.items()}


class GlobalDirection:
    """g_G = -mean Delta / (K eta_r), zero in round 0; a client applies x <- x - beta eta_r g_G after each step."""

    def __init__(self, K):
        self.K, self.g = K, None

    def apply(self, x, beta, eta):
        return x if self.g is None else {k: x[k] - beta * eta * self.g[k] for k in x}

    def update(self, x, x_next, eta):
        self.g = {k: -(x_next[k] - x[k]) / (self.K * eta) for k in x}


def ns5(U):
    """Quintic Newton-Schulz, 5 steps, in bfloat16 (docs/algorithms.md 1.3): X <- U/||U||; X <- a X + (b A + c A A) X with
    A = X X^T. addmm as torch.optim.Muon writes it, so the bfloat16 roundings agree bit for bit."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X_ = U.float().bfloat16()
    X_ = X_ / X_.norm().clamp(min=1e-7)
    for _ in range(5):
        A = X_ @ X_.T
        X_ = torch.addmm(X_, torch.addmm(A, A, A, beta=b, alpha=c), X_, beta=a)
    return X_.double()


EXACT = {"momentum_form": "sum", "ortho": "svd", "nesterov": False}  # FedMuon's Algorithm 1 (docs/algorithms.md 2.8)


def polar(U):
    u, _, vh = torch.linalg.svd(U)
    return u @ vh


@pytest.mark.parametrize("name, mu, beta, synced, form", [("fedpac_muon", 0.95, 0.5, True, {}),
                                                          ("fedmuon", 0.98, 0.5, True, {}),
                                                          ("fedmuon", 0.98, 0.5, True, EXACT),
                                                          ("local_muon", 0.95, 0.0, False, {})])
def test_muon_family(tmp_path, name, mu, beta, synced, form):
    """Muon (EMA momentum, nesterov, NS5, lr x 100, decoupled wd 0.01) on W, AdamW (0.9, 0.95, eps 1e-10) on b, both
    at eta_r (1 - beta); then x <- x - beta eta_r g_G; the momenta averaged and warm-started (FedMuon / FedPAC) or
    reset (Local Muon). docs/algorithms.md 1.3, 2.8, 2.9a. With ``EXACT``: M <- mu M + G and the SVD's U V^T instead."""
    K, wd, mult = 2, 0.01, 100.0
    mix, Bbar, finals_B = GlobalDirection(K), [None], {}

    def client(i, r, eta, x, sample):
        lr = eta * (1 - beta)
        buf = Bbar[0].clone() if synced and Bbar[0] is not None else torch.zeros(2, 2, dtype=torch.float64)
        m, v = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
        for t in range(1, K + 1):
            g = grad(x, i)
            if form:
                buf = mu * buf + g[W]
                O = polar(buf)
            else:
                buf = buf + (1 - mu) * (g[W] - buf)
                O = ns5(g[W] + mu * (buf - g[W]))
            x[W] = x[W] * (1 - lr * mult * wd) - lr * mult * O  # sqrt(max(1, rows/cols)) = 1
            m, v = 0.9 * m + 0.1 * g[B], 0.95 * v + 0.05 * g[B] ** 2
            x[B] = x[B] * (1 - lr * wd) - lr * (m / (1 - 0.9 ** t)) / ((v / (1 - 0.95 ** t)).sqrt() + 1e-10)
            x = mix.apply(x, beta, eta)
        finals_B[i] = buf
        return x

    def server(r, eta, x, finals, sample):
        x_next = mean_server(r, eta, x, finals, sample)
        mix.update(x, x_next, eta)
        Bbar[0] = sum(finals_B[i] for i in finals) / len(finals)
        return x_next

    got, _ = run(tmp_path, name, rounds=2, local_steps=K, algorithm_kwargs=form)
    assert_matches(got, federate(2, ALGO_LR[name], client, server), rtol=1e-4, atol=1e-6)


def sorted_eigenvectors(M):
    return torch.linalg.eigh(M)[1].flip(1)  # descending eigenvalue


def refreshed(factor, basis, V, dim):
    """SOAP's cheap refresh of one side: sort by Rayleigh quotients, permute V along ``dim``, one power step + QR."""
    order = torch.argsort(torch.diagonal(basis.T @ factor @ basis), descending=True)
    return torch.linalg.qr(factor @ basis[:, order])[0], V.index_select(dim, order)


@pytest.mark.parametrize("name, beta, synced", [("fedpac_soap", 0.5, True), ("local_soap", 0.0, False)])
def test_soap_family(tmp_path, name, beta, synced):
    """SOAP (docs/algorithms.md 1.4): the first step of a round only builds L, R (from Lbar, Rbar under FedPAC, from 0
    otherwise) and Q = eigh, moving nothing but the correction; then Adam in the eigenbasis, bias-corrected, decoupled
    wd after the step, then L, R absorb G; every f = 2 updates each basis is refreshed: columns sorted by
    diag(Q^T L Q) descending, V permuted alongside, Q <- QR(L Q_sorted), m re-projected. b (1-D) has no factor: the
    same Adam with identity basis. lr eta_r (1 - beta); FedPAC averages L, R (2.9b)."""
    # eps 1e-3, not 1e-8: step 2 sees the gradient that built Q (step 1 moves nothing), so G' = Q_L^T G Q_R is
    # diagonal up to rounding and m / (sqrt(V) + 1e-8) would turn that rounding into +-1 steps.
    K, f, b1, b2, eps, wd = 4, 2, 0.95, 0.95, 1e-3, 0.01
    mix, bar, final_LR = GlobalDirection(K), {}, {}

    def client(i, r, eta, x, sample):
        lr = eta * (1 - beta)
        z = torch.zeros(2, 2, dtype=torch.float64)
        L, R = (bar["L"].clone(), bar["R"].clone()) if synced and bar else (z.clone(), z.clone())
        QL = QR = None
        mW, vW, mb, vb = z.clone(), z.clone(), torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
        for k in range(K):
            g = grad(x, i)
            G = g[W]
            if k == 0:  # builds the eigenbasis only
                L, R = b2 * L + (1 - b2) * G @ G.T, b2 * R + (1 - b2) * G.T @ G
                QL, QR = sorted_eigenvectors(L), sorted_eigenvectors(R)
            else:
                t = k
                scale = math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                Gr = QL.T @ G @ QR
                mW, vW = b1 * mW + (1 - b1) * Gr, b2 * vW + (1 - b2) * Gr ** 2
                x[W] = x[W] - lr * scale * (QL @ (mW / (vW.sqrt() + eps)) @ QR.T)
                x[W] = x[W] * (1 - lr * wd)
                L, R = b2 * L + (1 - b2) * G @ G.T, b2 * R + (1 - b2) * G.T @ G
                if t % f == 0:
                    m_orig = QL @ mW @ QR.T
                    QL, vW = refreshed(L, QL, vW, 0)
                    QR, vW = refreshed(R, QR, vW, 1)
                    mW = QL.T @ m_orig @ QR
                mb, vb = b1 * mb + (1 - b1) * g[B], b2 * vb + (1 - b2) * g[B] ** 2
                x[B] = (x[B] - lr * scale * mb / (vb.sqrt() + eps)) * (1 - lr * wd)
            x = mix.apply(x, beta, eta)
        final_LR[i] = (L, R)
        return x

    def server(r, eta, x, finals, sample):
        x_next = mean_server(r, eta, x, finals, sample)
        mix.update(x, x_next, eta)
        bar["L"] = sum(final_LR[i][0] for i in finals) / len(finals)
        bar["R"] = sum(final_LR[i][1] for i in finals) / len(finals)
        return x_next

    got, _ = run(tmp_path, name, rounds=2, local_steps=K, learning_rate=0.05,
                 local_optimizer_kwargs={"eps": eps, "precondition_frequency": f})
    assert_matches(got, federate(2, 0.05, client, server), rtol=1e-4, atol=1e-6)


SOPHIA = {"hessian_estimator": "empirical_fisher", "hess_interval": 2, "rho": 50.0}  # deterministic curvature


@pytest.mark.parametrize("name, beta, policy, options", [("fedpac_sophia", 0.5, "average", {}),
                                                         ("fed_sophia", 0.0, "persist m and h", {}),
                                                         ("fed_sophia", 0.0, "persist", {"keep_momentum": False}),
                                                         ("local_sophia", 0.0, "reset", {})])
def test_sophia_family(tmp_path, name, beta, policy, options):
    """SophiaG (docs/algorithms.md 1.5): h <- b2 h + (1-b2) g*g at steps 0, 2, ... (empirical Fisher on the step's batch,
    bs = its rows); x <- x(1 - lr wd); m <- b1 m + (1-b1) g; x <- x - lr sign(m) min(|m| / (rho bs h + 1e-15), 1).
    h is averaged and warm-started (FedPAC_Sophia, 2.9c), kept per client with m (Fed-Sophia, 2.12; m restarts with
    ``keep_momentum=False``) or reset (Local Sophia, 2.1); m restarts each round unless kept. 3 clients, 2 per
    round, 3 rounds: a client's own h is older than the average."""
    K, b1, b2, wd, rho, bs, N, S = 3, 0.9, 0.99, 0.01, 50.0, 2, 3, 2
    mix, hbar, own, own_m, finals_h = GlobalDirection(K), {}, {}, {}, {}

    def client(i, r, eta, x, sample):
        lr = eta * (1 - beta)
        h = hbar if policy == "average" else own.get(i, {}) if policy.startswith("persist") else {}
        h = {k: h[k].clone() for k in h} if h else zeros_like(x)
        m = own_m[i] if policy == "persist m and h" and i in own_m else zeros_like(x)
        for k in range(K):
            g = grad(x, i)
            if k % 2 == 0:
                h = {n: b2 * h[n] + (1 - b2) * g[n] ** 2 for n in x}
            for n in x:
                x[n] = x[n] * (1 - lr * wd)
                m[n] = b1 * m[n] + (1 - b1) * g[n]
                x[n] = x[n] - lr * m[n].sign() * (m[n].abs() / (rho * bs * h[n] + 1e-15)).clamp(max=1.0)
            x = mix.apply(x, beta, eta)
        finals_h[i] = own[i] = h
        own_m[i] = m
        return x

    def server(r, eta, x, finals, sample):
        x_next = mean_server(r, eta, x, finals, sample)
        mix.update(x, x_next, eta)
        hbar.update({n: sum(finals_h[i][n] for i in finals) / len(finals) for n in x})
        return x_next

    got, _ = run(tmp_path, name, rounds=3, local_steps=K, num_clients=N, per_round=S, learning_rate=0.05,
                 algorithm_kwargs={**SOPHIA, **options})
    assert_matches(got, federate(3, 0.05, client, server, num_clients=N, per_round=S), rtol=1e-4, atol=1e-6)


def test_fedlada(tmp_path):
    """Adam, coupled wd 1e-3, at eta_r (1 - 0.9); v averaged and warm-started, m reset; then
    x <- x - 0.9 eta_r g_G, g_G = -(the last round's mean Delta) / (K eta_r) (Sun et al., 2023). Round 1 (no v
    carried yet) is bias-corrected Adam, later rounds (v warm-started) are not, as in the FedAdamW code's FedLADA."""
    K, beta, b1, b2, eps, wd = 2, 0.9, 0.9, 0.999, 1e-8, 1e-3
    mix, vbar, finals_v = GlobalDirection(K), {}, {}

    def client(i, r, eta, x, sample):
        lr = eta * (1 - beta)
        fresh = not vbar
        v = zeros_like(x) if fresh else {k: t.clone() for k, t in vbar.items()}
        m = zeros_like(x)
        for t in range(1, K + 1):
            g = grad(x, i)
            c1, c2 = (1 - b1 ** t, 1 - b2 ** t) if fresh else (1.0, 1.0)
            for n in x:
                d = g[n] + wd * x[n]
                m[n], v[n] = b1 * m[n] + (1 - b1) * d, b2 * v[n] + (1 - b2) * d ** 2
                x[n] = x[n] - lr * (m[n] / c1) / ((v[n] / c2).sqrt() + eps)
            x = mix.apply(x, beta, eta)
        finals_v[i] = v
        return x

    def server(r, eta, x, finals, sample):
        x_next = mean_server(r, eta, x, finals, sample)
        mix.update(x, x_next, eta)
        vbar.update({n: sum(finals_v[i][n] for i in finals) / len(finals) for n in x})
        return x_next

    got, _ = run(tmp_path, "fedlada", rounds=2, local_steps=K, learning_rate=0.05)
    assert_matches(got, federate(2, 0.05, client, server), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("position", ["after", "before"])
def test_fadam_tracking(tmp_path, position):
    """FAdamET ("after") / FAdamGT ("before"), docs/algorithms.md 2.13: AMSGrad without bias correction, v and v_hat
    start from the client's persisted v_hat, m from 0; ET: x <- x - eta (A + y - y_i); GT: the moments see
    g + y - y_i. Y_r = the first half of the draw; ET y_i+ = y_i - y + (x^r - x^K)/(eta K), GT y_i+ = mean raw g;
    y <- y + (1/N) sum Delta y_i. 3 clients, 2 per round: 1/N, 1/S and 1/|Y| all differ."""
    K, b1, b2, eps, wd, N, S, R = 2, 0.9, 0.99, 1e-8, 1e-8, 3, 2, 3
    y, y_i, vhat_i, dy = {}, {}, {}, {}

    def client(i, r, eta, x, sample):
        x_r = {k: t.clone() for k, t in x.items()}
        shift = {n: y.get(n, 0.0) - y_i.get(i, {}).get(n, 0.0) for n in x}
        vhat = {n: t.clone() for n, t in vhat_i[i].items()} if i in vhat_i else zeros_like(x)
        v, m, gsum = {n: t.clone() for n, t in vhat.items()}, zeros_like(x), zeros_like(x)
        for _ in range(K):
            g = grad(x, i)
            for n in x:
                gsum[n] = gsum[n] + g[n]
                gt = g[n] + (shift[n] if position == "before" else 0.0) + wd * x[n]
                m[n], v[n] = b1 * m[n] + (1 - b1) * gt, b2 * v[n] + (1 - b2) * gt ** 2
                vhat[n] = torch.maximum(vhat[n], v[n])
                x[n] = x[n] - eta * m[n] / (vhat[n].sqrt() + eps)
                if position == "after":
                    x[n] = x[n] - eta * shift[n]
        vhat_i[i] = vhat
        if i in sample[: math.ceil(0.5 * len(sample))]:
            old = y_i.get(i, zeros_like(x))
            new = ({n: old[n] - y.get(n, 0.0) + (x_r[n] - x[n]) / (eta * K) for n in x} if position == "after"
                   else {n: gsum[n] / K for n in x})
            dy[i], y_i[i] = {n: new[n] - old[n] for n in x}, new
        return x

    def server(r, eta, x, finals, sample):
        tracked = [i for i in finals if i in dy]
        y.update({n: y.get(n, 0.0) + sum(dy[i][n] for i in tracked) / N for n in x})
        dy.clear()
        return mean_server(r, eta, x, finals, sample)

    got, _ = run(tmp_path, f"fadam_{'et' if position == 'after' else 'gt'}", rounds=R, local_steps=K,
                 num_clients=N, per_round=S, learning_rate=0.02)
    assert_matches(got, federate(R, 0.02, client, server, num_clients=N, per_round=S), rtol=1e-4, atol=1e-6)


def test_prefed(tmp_path):
    """PreFed (docs/algorithms.md 1.8, 2.14): m <- b1 m + (1-b1) g; P <- b2 P + (1-b2)(g - m)^2 with the new m;
    x <- x - eta m / sqrt(P + tau); P averaged and warm-started, m reset each round."""
    K, b1, b2, tau = 2, 0.9, 0.9, 1e-3
    Pbar, finals_P = {}, {}

    def client(i, r, eta, x, sample):
        P = {k: t.clone() for k, t in Pbar.items()} if Pbar else zeros_like(x)
        m = zeros_like(x)
        for _ in range(K):
            g = grad(x, i)
            for n in x:
                m[n] = b1 * m[n] + (1 - b1) * g[n]
                P[n] = b2 * P[n] + (1 - b2) * (g[n] - m[n]) ** 2
                x[n] = x[n] - eta * m[n] / (P[n] + tau).sqrt()
        finals_P[i] = P
        return x

    def server(r, eta, x, finals, sample):
        Pbar.update({n: sum(finals_P[i][n] for i in finals) / len(finals) for n in x})
        return mean_server(r, eta, x, finals, sample)

    got, _ = run(tmp_path, "prefed", rounds=2, local_steps=K, learning_rate=0.01)
    assert_matches(got, federate(2, 0.01, client, server), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["fedpm", "localnewton"])
def test_foof_family(tmp_path, name):
    """FOOF (docs/algorithms.md 1.6): [W|b] <- [W|b] - lr [G_W + wd W | G_b + wd b] (A + lam I)^{-1}, A = mean [x;1][x;1]^T
    over the client's rows; FedPM mixes [W|b]^{r+1} = [W|b]^r + [sum Delta_i P_i][sum P_j]^{-1}, P = A + lam I
    (2.10); LocalNewton averages (2.11). Defaults lr 0.3, lam 1, wd 1e-4 (FedPM Table 4)."""
    K, lam, wd = 2, 1.0, 1e-4
    P_i = {}

    def aug(x):
        return torch.cat([x[W], x[B][:, None]], dim=1)

    def client(i, r, eta, x, sample):
        rows = torch.cat([client_rows(i)[0], torch.ones(2, 1, dtype=torch.float64)], dim=1)
        P_i[i] = rows.T @ rows / len(rows) + lam * torch.eye(3, dtype=torch.float64)
        for _ in range(K):
            g = grad(x, i)
            step = torch.cat([g[W] + wd * x[W], (g[B] + wd * x[B])[:, None]], dim=1) @ torch.linalg.inv(P_i[i])
            x = {W: x[W] - eta * step[:, :2], B: x[B] - eta * step[:, 2]}
        return x

    def fedpm_server(r, eta, x, finals, sample):
        num = sum((aug(finals[i]) - aug(x)) @ P_i[i] for i in finals)
        new = aug(x) + num @ torch.linalg.inv(sum(P_i[i] for i in finals))
        return {W: new[:, :2], B: new[:, 2]}

    got, _ = run(tmp_path, name, rounds=2, local_steps=K)
    server = fedpm_server if name == "fedpm" else mean_server
    assert_matches(got, federate(2, 0.3, client, server), rtol=1e-4, atol=1e-6)
