"""The server chain's state keys: by transform name, and position keys of older checkpoints renamed on load."""

from __future__ import annotations

import pytest
import torch

from fedhf.core.context import ServerContext
from fedhf.core.sums import RoundSums
from fedhf.server import Mean, ServerMomentum, ServerRule, build_server_rule

X = {"w": torch.tensor([1.0, -2.0], dtype=torch.float64)}
D = torch.tensor([0.5, 0.25], dtype=torch.float64)


def _ctx():
    return ServerContext(round=0, round_lr=0.1, local_steps=1, num_clients=2, sums=RoundSums(), global_params=X,
                         mean_delta={"w": D})


def test_state_is_keyed_by_transform_name_and_a_repeated_name_is_numbered():
    assert set(build_server_rule("mean+adam").init(X)) == {"adam.m.w", "adam.v.w"}
    twice = ServerRule(Mean(), [ServerMomentum(beta=0.5), ServerMomentum(beta=0.9)])
    assert set(twice.init(X)) == {"momentum.v.w", "momentum#2.v.w"}
    _, state = twice.apply(X, twice.init(X), _ctx())
    assert set(state) == {"momentum.v.w", "momentum#2.v.w"}


def test_position_keys_of_an_older_checkpoint_are_renamed_in_chain_order():
    twice = ServerRule(Mean(), [ServerMomentum(beta=0.5), ServerMomentum(beta=0.9)])
    a, b = torch.tensor([0.1, -0.3], dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64)
    state = twice.load_state({"0.v.w": a, "1.v.w": b})
    assert set(state) == {"momentum.v.w", "momentum#2.v.w"}
    x, _ = twice.apply(X, state, _ctx())
    # by hand: v1 = 0.5 a + D (its step, lr 1, is v1), v2 = 0.9 b + v1, x + v2
    expected = [X["w"][j].item() + 0.9 * b[j].item() + 0.5 * a[j].item() + D[j].item() for j in range(2)]
    assert x["w"].tolist() == pytest.approx(expected, rel=1e-12)
    assert twice.load_state(state).keys() == state.keys()  # today's keys stay as they are


@pytest.mark.parametrize("key", ["2.v.w", "adam.m.w", "momentum#3.v.w", "v"])
def test_a_key_of_no_transform_of_the_chain_is_refused(key):
    twice = ServerRule(Mean(), [ServerMomentum(), ServerMomentum()])
    with pytest.raises(ValueError, match="belongs to no transform of this server rule"):
        twice.load_state({"0.v.w": torch.zeros(2), key: torch.zeros(2)})


def test_a_transform_name_that_cannot_key_its_state_is_refused():
    odd = ServerMomentum()
    odd.name = "mom.entum"
    with pytest.raises(ValueError, match="keys its state"):
        ServerRule(Mean(), [odd])
