"""Every registered aggregator and server transform through the same checks (one suite per axis): a zero direction
is no step at round 0, state survives a safetensors round trip, and aggregation does not depend on client order.
A registered component missing from the lists below fails the coverage test (corrections and state-sync rules
have theirs in tests/corrections/ and tests/sync/)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from fedhf.core.sums import RoundSums
from fedhf.core.context import ServerContext
from fedhf.server import AGGREGATORS, SERVER_TRANSFORMS

TRANSFORMS = {"lr": {}, "momentum": {"beta": 0.5}, "adam": {}, "yogi": {}, "adagrad": {}, "prefedopt": {}}
AGGREGATOR_CASES = {"mean": {}, "median": {}, "trimmed_mean": {"trim_fraction": 0.25}, "preconditioned_mix": {},
                    "fedex_lora": {}, "flora": {}, "flexlora": {}, "fedsvd": {}}


def test_every_registered_component_is_in_a_conformance_list():
    assert set(SERVER_TRANSFORMS.names()) == set(TRANSFORMS)
    assert set(AGGREGATORS.names()) == set(AGGREGATOR_CASES)


def _ctx(x, gathered=(), sums=None):
    mean = {n: sum(g[n] for g in gathered) / len(gathered) for n in x} if gathered else {n: torch.zeros_like(t)
                                                                                       for n, t in x.items()}
    return ServerContext(round=0, round_lr=0.1, local_steps=2, num_clients=4, sums=sums or RoundSums(),
                         global_params=x, mean_delta=mean, gathered=list(gathered))


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_transform_zero_direction_and_state_round_trip(name):
    transform = SERVER_TRANSFORMS.get(name)(**TRANSFORMS[name])
    x = {"w": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)}
    state = transform.init(x)
    same, _ = transform.apply(x, {"w": torch.zeros(3, dtype=torch.float64)}, state, _ctx(x))
    assert torch.equal(same["w"], x["w"])  # no direction, no step (round 0)
    d = {"w": torch.tensor([0.3, -0.1, 0.2], dtype=torch.float64)}
    _, state = transform.apply(x, d, state, _ctx(x))
    reloaded = load(save(state)) if state else {}
    a, _ = transform.apply(x, d, state, _ctx(x))
    b, _ = transform.apply(x, d, reloaded, _ctx(x))
    assert torch.equal(a["w"], b["w"])  # what a checkpoint keeps is all the transform needs


@pytest.mark.parametrize("name", sorted(AGGREGATOR_CASES))
def test_aggregation_does_not_depend_on_client_order(name):
    aggregator = AGGREGATORS.get(name)(**AGGREGATOR_CASES[name])
    g = torch.Generator().manual_seed(0)
    x = {"w": torch.zeros(2, 3, dtype=torch.float64)}
    updates = [{"w": torch.randn(2, 3, generator=g, dtype=torch.float64)} for _ in range(4)]
    forward = aggregator.aggregate(_ctx(x, updates))
    backward = aggregator.aggregate(_ctx(x, updates[::-1]))
    torch.testing.assert_close(forward["w"], backward["w"], rtol=1e-12, atol=1e-12)
    same = aggregator.aggregate(_ctx(x, [updates[0]] * 3))  # identical clients: their update
    torch.testing.assert_close(same["w"], updates[0]["w"], rtol=1e-12, atol=1e-12)
