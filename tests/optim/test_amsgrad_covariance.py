"""AMSGrad-Adam without bias correction (FAdam, FedLADA) and PreFed's covariance optimizer: hand computations
of a few steps, warm starts from an imported Theta, and the conformance every local optimizer must pass."""

from __future__ import annotations

import math

import pytest
import torch

from fedhf.optim.amsgrad import AMSGradNoBias
from fedhf.optim.covariance import CovarianceAdam

P0 = [0.5, -1.0]
# Coordinate 0's gradient shrinks, so v falls below its running max and the AMSGrad max binds.
GRADS = [[1.0, 0.2], [0.1, -0.3], [0.05, 0.4]]


def _run(optimizer_cls, grads=GRADS, theta=None, **kwargs):
    p = torch.nn.Parameter(torch.tensor(P0, dtype=torch.float64))
    optimizer = optimizer_cls([("w", p)], **kwargs)
    if theta is not None:
        optimizer.import_theta(theta)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
    return p.detach().tolist(), optimizer


def _amsgrad_by_hand(lr, b1, b2, eps, wd, amsgrad, v0=(0.0, 0.0)):
    out, v_hats, vs = [], [], []
    for j, p in enumerate(P0):
        m, v, v_hat = 0.0, v0[j], v0[j]
        for g in GRADS:
            g = g[j] + wd * p
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            v_hat = max(v_hat, v) if amsgrad else v
            p = p - lr * m / (math.sqrt(v_hat) + eps)
        out.append(p)
        v_hats.append(v_hat)
        vs.append(v)
    return out, v_hats, vs


@pytest.mark.parametrize("amsgrad", [True, False])
def test_amsgrad_no_bias_matches_hand_computation(amsgrad):
    kwargs = {"lr": 0.1, "betas": (0.8, 0.5), "eps": 1e-8, "weight_decay": 0.01, "amsgrad": amsgrad}
    got, optimizer = _run(AMSGradNoBias, **kwargs)
    expected, v_hats, vs = _amsgrad_by_hand(0.1, 0.8, 0.5, 1e-8, 0.01, amsgrad)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    assert state["exp_avg_sq"].tolist() == pytest.approx(vs, rel=1e-12)
    if amsgrad:
        assert state["max_exp_avg_sq"].tolist() == pytest.approx(v_hats, rel=1e-12)
        assert v_hats[0] > vs[0] * 1.5  # the max actually binds on coordinate 0
    else:
        assert "max_exp_avg_sq" not in state


def test_amsgrad_max_changes_the_result():
    with_max, _ = _run(AMSGradNoBias, lr=0.1, betas=(0.8, 0.5), amsgrad=True)
    without, _ = _run(AMSGradNoBias, lr=0.1, betas=(0.8, 0.5), amsgrad=False)
    assert abs(with_max[0] - without[0]) > 1e-3


def test_amsgrad_theta_is_v_hat_or_v_and_warm_start_fills_v_and_v_hat():
    _, optimizer = _run(AMSGradNoBias, lr=0.1, betas=(0.8, 0.5))
    assert set(optimizer.export_theta()) == {"max_exp_avg_sq:w"}
    _, plain = _run(AMSGradNoBias, lr=0.1, betas=(0.8, 0.5), amsgrad=False)
    assert set(plain.export_theta()) == {"exp_avg_sq:w"}

    v0 = (0.7, 0.02)
    theta = {"max_exp_avg_sq:w": torch.tensor(v0, dtype=torch.float64)}
    p = torch.nn.Parameter(torch.tensor(P0, dtype=torch.float64))
    fresh = AMSGradNoBias([("w", p)], lr=0.1, betas=(0.8, 0.5), weight_decay=0.01)
    fresh.import_theta(theta)
    state = fresh.state[p]
    assert torch.equal(state["exp_avg_sq"], state["max_exp_avg_sq"]) and "exp_avg" not in state  # m starts at 0
    got, _ = _run(AMSGradNoBias, theta=theta, lr=0.1, betas=(0.8, 0.5), weight_decay=0.01)
    expected, _, _ = _amsgrad_by_hand(0.1, 0.8, 0.5, 1e-8, 0.01, True, v0=v0)
    assert got == pytest.approx(expected, rel=1e-6)  # Theta is stored in fp32


def _covariance_by_hand(lr, b1, b2, tau, wd, P0_=(0.0, 0.0)):
    out, Ps = [], []
    for j, p in enumerate(P0):
        m, P = 0.0, P0_[j]
        for g in GRADS:
            g = g[j] + wd * p
            m = b1 * m + (1 - b1) * g
            P = b2 * P + (1 - b2) * (g - m) ** 2  # the updated m
            p = p - lr * m / math.sqrt(P + tau)
        out.append(p)
        Ps.append(P)
    return out, Ps


def test_covariance_adam_matches_hand_computation():
    got, optimizer = _run(CovarianceAdam, lr=0.05, betas=(0.9, 0.8), tau=1e-3, weight_decay=0.01)
    expected, Ps = _covariance_by_hand(0.05, 0.9, 0.8, 1e-3, 0.01)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert optimizer.export_theta()["P:w"].tolist() == pytest.approx(Ps, rel=1e-6)


def test_covariance_adam_warm_start_keeps_P_and_resets_m():
    theta = {"P:w": torch.tensor([0.3, 0.01])}
    got, optimizer = _run(CovarianceAdam, theta=theta, lr=0.05, betas=(0.9, 0.8), tau=1e-3)
    expected, _ = _covariance_by_hand(0.05, 0.9, 0.8, 1e-3, 0.0, P0_=(0.3, 0.01))
    assert got == pytest.approx(expected, rel=1e-6)  # Theta is stored in fp32
    assert set(optimizer.export_theta()) == {"P:w"}


def test_defaults_are_the_papers():
    p = torch.nn.Parameter(torch.zeros(2))
    ams = AMSGradNoBias([p]).defaults
    assert (ams["lr"], ams["betas"], ams["eps"], ams["weight_decay"]) == (1e-3, (0.9, 0.99), 1e-8, 1e-8)
    assert AMSGradNoBias([p]).amsgrad
    cov = CovarianceAdam([p]).defaults
    assert (cov["lr"], cov["betas"], cov["tau"], cov["weight_decay"]) == (1e-3, (0.9, 0.9), 1e-3, 0.0)


def test_fresh_bias_correction_corrects_only_a_round_without_imported_v():
    """FedLADA: bias-corrected Adam steps while v was not imported; plain steps after a warm start."""
    lr, b1, b2, eps, wd = 0.1, 0.8, 0.5, 1e-8, 0.01
    kwargs = {"lr": lr, "betas": (b1, b2), "eps": eps, "weight_decay": wd, "amsgrad": False,
              "fresh_bias_correction": True}
    fresh, optimizer = _run(AMSGradNoBias, grads=GRADS[:2], **kwargs)
    expected = []
    for j, p in enumerate(P0):  # two steps of Adam (Kingma & Ba, Algorithm 1), written out
        m = v = 0.0
        for t, g in enumerate(GRADS[:2], start=1):
            g = g[j] + wd * p
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            p = p - lr * (m / (1 - b1 ** t)) / (math.sqrt(v / (1 - b2 ** t)) + eps)
        expected.append(p)
    assert fresh == pytest.approx(expected, rel=1e-12, abs=1e-12)
    uncorrected, _ = _run(AMSGradNoBias, grads=GRADS[:2], **{**kwargs, "fresh_bias_correction": False})
    assert abs(fresh[0] - uncorrected[0]) > 1e-2  # the first steps differ materially

    theta = optimizer.export_theta()  # the next round: v warm-started, no correction
    warm, _ = _run(AMSGradNoBias, grads=GRADS[2:], theta=theta, **kwargs)
    v0 = theta["exp_avg_sq:w"].tolist()
    by_hand = []
    for j, p in enumerate(P0):
        g = GRADS[2][j] + wd * p
        m, v = (1 - b1) * g, b2 * v0[j] + (1 - b2) * g * g
        by_hand.append(p - lr * m / (math.sqrt(v) + eps))
    assert warm == pytest.approx(by_hand, rel=1e-6)  # Theta is stored in fp32
