"""Server rules against hand computations on small tensors (scalar Python, independent of the code)."""

from __future__ import annotations

import math

import pytest
import torch

from fedhf.aggregation import RoundSums
from fedhf.context import ServerContext
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


def test_mean_rule_is_server_lr_times_mean_delta():
    expected = [x + 2.0 * sum(d[j] for d in DELTAS) for j, x in enumerate(X0)]
    assert _run(Step(lr=2.0)) == pytest.approx(expected, rel=1e-12)  # the mean aggregator's D, times eta_g


def test_bad_server_kwargs_are_refused():
    with pytest.raises(ValueError, match="tau"):
        AdaptiveServer("adam", tau=0)
    with pytest.raises(ValueError, match="beta"):
        ServerMomentum(beta=1.5)
