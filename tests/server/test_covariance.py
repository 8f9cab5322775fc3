"""PreFedOpt (server-side covariance preconditioner) against a scalar hand computation."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fedhf.core.sums import RoundSums
from fedhf.core.context import ServerContext
from fedhf.server.covariance import CovarianceServer

X0 = [1.0, -2.0, 0.5]
DELTAS = [[0.1, -0.2, 0.0], [0.3, 0.05, -0.4]]
K = 5


def _ctx(x):
    return ServerContext(round=0, round_lr=0.1, local_steps=K, num_clients=10, sums=RoundSums(), global_params=x,
                         mean_delta=x)


def _by_hand(lr, b1, b2, tau):
    out = []
    for j, x in enumerate(X0):
        m, P = 0.0, 0.0
        for d in DELTAS:
            D = d[j] / K  # per-step average
            m = b1 * m + (1 - b1) * D
            P = b2 * P + (1 - b2) * (D - m) ** 2
            x = x + lr * D / math.sqrt(P + tau)
        out.append(x)
    return out


@pytest.mark.parametrize("kwargs", [{}, {"lr": 0.2, "beta1": 0.5, "beta2": 0.7, "tau": 1e-4}])
def test_two_rounds_match_hand_computation(kwargs):
    rule = CovarianceServer(**kwargs)
    x = {"w": torch.tensor(X0, dtype=torch.float64)}
    state = rule.init(x)
    assert all(torch.equal(t, torch.zeros(3, dtype=torch.float64)) for t in state.values())  # m^0 = P^0 = 0
    for d in DELTAS:
        x, state = rule.apply(x, {"w": torch.tensor(d, dtype=torch.float64)}, state, ctx=_ctx(x))
    expected = _by_hand(rule.lr, rule.beta1, rule.beta2, rule.tau)
    assert x["w"].tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert set(state) == {"m.w", "P.w"}


def test_defaults_context_and_validation():
    rule = CovarianceServer()
    assert (rule.lr, rule.beta1, rule.beta2, rule.tau) == (0.05, 0.9, 0.9, 1e-3)
    assert rule.name == "prefedopt"
    x = {"w": torch.zeros(1)}
    with pytest.raises(ValueError, match="ServerContext"):
        rule.apply(x, x, rule.init(x), dataclasses.replace(_ctx(x), local_steps=0))
    with pytest.raises(ValueError, match="tau"):
        CovarianceServer(tau=0)
    with pytest.raises(ValueError, match="beta2"):
        CovarianceServer(beta2=1.0)
