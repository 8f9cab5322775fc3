"""Server rules against hand computations on small tensors (scalar Python, independent of the code)."""

from __future__ import annotations

import math

import pytest
import torch

from fedhf.core.sums import RoundSums
from fedhf.core.context import ServerContext
from fedhf.server import AdaptiveServer, ServerMomentum, Step

X0 = [1.0, -2.0, 0.5]
DELTAS = [[0.1, -0.2, 0.0], [0.3, 0.05, -0.4], [-0.2, 0.1, 0.25]]


def _run(rule):
    x = {"w": torch.tensor(X0, dtype=torch.float64)}
    state = rule.init(x)
    for d in DELTAS:
        ctx = ServerContext(round=0, round_lr=0.1, local_steps=1, num_clients=3, sums=RoundSums(), global_params=x,
                            mean_delta={})
        x, state = rule.apply(x, {"w": torch.tensor(d, dtype=torch.float64)}, state, ctx)
    return x["w"].tolist()


def _by_hand(kind, lr, b1, b2, tau):
    out = []
    for j, x in enumerate(X0):
        m, v = 0.0, tau * tau
        for d in DELTAS:
            g = d[j]
            m = b1 * m + (1 - b1) * g
            if kind == "adagrad":
                v = v + g * g
            elif kind == "adam":
                v = b2 * v + (1 - b2) * g * g
            else:  # yogi: v - (1-b2) g^2 sign(v - g^2)
                s = v - g * g
                v = v - (1 - b2) * g * g * (1.0 if s > 0 else -1.0 if s < 0 else 0.0)
            x = x + lr * m / (math.sqrt(v) + tau)
        out.append(x)
    return out


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_adaptive_server_matches_hand_computation(kind):
    rule = AdaptiveServer(kind, lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3)
    assert _run(rule) == pytest.approx(_by_hand(kind, 0.05, 0.9, 0.99, 1e-3), rel=1e-12, abs=1e-12)


def test_adaptive_rules_differ_from_each_other():
    results = {k: _run(AdaptiveServer(k, lr=0.05)) for k in ("adam", "yogi", "adagrad")}
    assert results["adam"] != results["yogi"] != results["adagrad"]


def test_momentum_matches_hand_computation():
    expected = []
    for j, x in enumerate(X0):
        v = 0.0
        for d in DELTAS:
            v = 0.9 * v + d[j]
            x = x + 0.7 * v
        expected.append(x)
    assert _run(ServerMomentum(lr=0.7, beta=0.9)) == pytest.approx(expected, rel=1e-12)


def _nesterov_by_hand(lr, beta):
    """torch.optim.SGD(nesterov=True) on the pseudo-gradient g = -D: buf = b buf + g; x -= lr (g + b buf)."""
    expected = []
    for j, x in enumerate(X0):
        buf = 0.0
        for d in DELTAS:
            g = -d[j]
            buf = beta * buf + g
            x = x - lr * (g + beta * buf)
        expected.append(x)
    return expected


def test_nesterov_momentum_matches_hand_computation_over_three_rounds():
    got = _run(ServerMomentum(lr=0.7, beta=0.9, nesterov=True))
    assert got == pytest.approx(_nesterov_by_hand(0.7, 0.9), rel=1e-12)
    assert got != pytest.approx(_run(ServerMomentum(lr=0.7, beta=0.9)), rel=1e-6)  # not the heavy ball


def test_nesterov_matches_torch_sgd_on_the_outer_gradient():
    """The same three rounds stepped by torch.optim.SGD(nesterov=True) on the pseudo-gradient -D."""
    x = torch.tensor(X0, dtype=torch.float64, requires_grad=True)
    sgd = torch.optim.SGD([x], lr=0.9, momentum=0.8, nesterov=True)
    for d in DELTAS:
        x.grad = -torch.tensor(d, dtype=torch.float64)
        sgd.step()
    assert _run(ServerMomentum(lr=0.9, beta=0.8, nesterov=True)) == pytest.approx(x.tolist(), rel=1e-12)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_zero_is_the_plain_server_lr_step(nesterov):
    assert _run(ServerMomentum(lr=0.7, beta=0.0, nesterov=nesterov)) == pytest.approx(_run(Step(lr=0.7)), rel=1e-12)


def test_mean_rule_is_server_lr_times_mean_delta():
    expected = [x + 2.0 * sum(d[j] for d in DELTAS) for j, x in enumerate(X0)]
    assert _run(Step(lr=2.0)) == pytest.approx(expected, rel=1e-12)  # the mean aggregator's D, times eta_g


def test_bad_server_kwargs_are_refused():
    with pytest.raises(ValueError, match="tau"):
        AdaptiveServer("adam", tau=0)
    with pytest.raises(ValueError, match="beta"):
        ServerMomentum(beta=1.5)
    with pytest.raises(ValueError, match="nesterov"):
        ServerMomentum(nesterov="yes")


def test_median_then_momentum_matches_hand_computation():
    """A chain: the coordinate-wise median of the round's updates, then server momentum (v <- b v + D; x += lr v)."""
    from fedhf.server import build_server_rule

    rule = build_server_rule("median+momentum", {"lr": 0.5, "beta": 0.8})
    rounds = [[[0.1, -0.2], [0.3, 0.05], [-0.2, 0.1]], [[1.0, 0.0], [0.2, 0.4], [0.5, -0.3]]]
    x = {"w": torch.tensor([1.0, -1.0], dtype=torch.float64)}
    state = rule.init(x)
    for updates in rounds:
        gathered = [{"w": torch.tensor(u, dtype=torch.float64)} for u in updates]
        ctx = ServerContext(round=0, round_lr=0.1, local_steps=1, num_clients=3, sums=RoundSums(), global_params=x,
                            mean_delta={}, gathered=gathered)
        x, state = rule.apply(x, state, ctx)
    expected = []
    for j, x0 in enumerate([1.0, -1.0]):
        v, value = 0.0, x0
        for updates in rounds:
            median = sorted(u[j] for u in updates)[1]
            v = 0.8 * v + median
            value = value + 0.5 * v
        expected.append(value)
    assert x["w"].tolist() == pytest.approx(expected, rel=1e-12)
    assert rule.gathers and rule.name == "median+momentum"


def test_server_adam_and_local_amsgrad_share_one_update_function():
    """FedAdam's moments are the local AMSGrad's (fedhf.core.updates.adaptive_moments_): the first server step from
    D equals lr times the local Adam (amsgrad=False) direction from gradient D, with eps = tau and v^0 = tau^2."""
    from fedhf.optim.amsgrad import amsgrad_no_bias_direction

    d = torch.tensor([0.3, -0.1, 0.02], dtype=torch.float64)
    rule = AdaptiveServer("adam", lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    x = {"w": torch.zeros(3, dtype=torch.float64)}
    ctx = ServerContext(round=0, round_lr=0.1, local_steps=1, num_clients=1, sums=RoundSums(), global_params=x,
                        mean_delta={})
    new_x, _ = rule.apply(x, {"w": d}, rule.init(x), ctx)
    m, v = torch.zeros(3, dtype=torch.float64), torch.full((3,), 1e-6, dtype=torch.float64)
    local = amsgrad_no_bias_direction(d, m, v, None, 0.9, 0.99, 1e-3)
    torch.testing.assert_close(new_x["w"], 0.1 * local, rtol=1e-14, atol=0.0)  # lr m / s vs lr (m / s): ulps
