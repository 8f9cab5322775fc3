"""Robust aggregators bound the influence of one adversarial client; they gather rather than sum."""

from __future__ import annotations

import pytest
import torch

from fedhf.core.sums import RoundSums
from fedhf.core.context import ServerContext
from fedhf.server import SERVER_RULES, RobustAggregator, ServerRule, Step
from fedhf.server.robust import coordinate_median, trimmed_mean


def _ctx(x, mean, gathered=()):
    return ServerContext(round=0, round_lr=0.1, local_steps=1, num_clients=7, sums=RoundSums(), global_params=x,
                         mean_delta=mean, gathered=list(gathered))


def test_median_and_trimmed_mean_by_hand():
    stacked = torch.tensor([[1.0, 10.0], [3.0, -2.0], [2.0, 0.0], [100.0, 1.0]])
    assert coordinate_median(stacked).tolist() == [2.5, 0.5]
    assert trimmed_mean(stacked, 0.25).tolist() == [2.5, 0.5]  # drops one low and one high per coordinate
    assert coordinate_median(stacked[:3]).tolist() == [2.0, 0.0]


def test_one_adversary_cannot_drag_the_model_away():
    torch.manual_seed(0)
    x = {"w": torch.zeros(50)}
    honest = [{"w": 1.0 + 0.1 * torch.randn(50)} for _ in range(6)]
    attack = [{"w": torch.full((50,), 1e6)}]
    updates = honest + attack
    mean = {"w": torch.stack([u["w"] for u in updates]).mean(0)}
    plain, _ = SERVER_RULES.get("mean")().apply(x, {}, _ctx(x, mean))
    assert plain["w"].min() > 1e5  # the mean is hijacked
    lo = torch.stack([u["w"] for u in honest]).min(0).values
    hi = torch.stack([u["w"] for u in honest]).max(0).values
    for rule in (RobustAggregator("median"), RobustAggregator("trimmed_mean", trim_fraction=0.15)):
        assert rule.gathers
        robust, _ = ServerRule(rule, [Step()]).apply(x, {}, _ctx(x, mean, updates))
        assert torch.all(robust["w"] >= lo) and torch.all(robust["w"] <= hi), rule


def test_trimming_everything_is_refused():
    with pytest.raises(ValueError, match="trim_fraction"):
        RobustAggregator("trimmed_mean", trim_fraction=0.5)
    with pytest.raises(ValueError, match="leaves no client"):
        trimmed_mean(torch.zeros(4, 3), 0.5)


def test_registered_as_server_rules():
    assert SERVER_RULES.get("median")().aggregator.kind == "median"
    assert SERVER_RULES.get("trimmed_mean")(trim_fraction=0.2).aggregator.trim_fraction == 0.2
