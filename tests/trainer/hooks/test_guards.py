"""A run where every client is excluded for max_excluded_rounds consecutive rounds stops with the likely cause."""

from __future__ import annotations

import pytest

from fedhf.trainer.hooks.guards import AllExcludedError, ExclusionGuard

from tests.helpers import config, digit_trainer, tiny_resnet
from tests.tiny_bert import tiny_run


def test_guard_counts_consecutive_rounds_whose_every_client_was_excluded():
    guard = ExclusionGuard(2)
    guard.after_round({"round": 1, "participants": 0, "excluded_clients": 2}, 0.1, None)
    guard.after_round({"round": 2, "participants": 3, "excluded_clients": 0}, 0.1, None)  # a survivor resets it
    guard.after_round({"round": 3, "participants": 0, "excluded_clients": 1}, 0.1, None)
    with pytest.raises(AllExcludedError, match=r"2 consecutive rounds \(up to round 4.*learning_rate.*0.1"):
        guard.after_round({"round": 4, "participants": 0, "excluded_clients": 3}, 0.1, None)


def test_a_round_no_client_trained_in_is_not_an_exclusion():
    """An empty Poisson sample (or every client offline or late) neither counts nor breaks the streak."""
    guard = ExclusionGuard(2)
    for r in range(10):
        guard.after_round({"round": r + 1, "participants": 0, "excluded_clients": 0}, 0.1, None)
    guard.after_round({"round": 11, "participants": 0, "excluded_clients": 1}, 0.1, None)
    guard.after_round({"round": 12, "participants": 0, "excluded_clients": 0}, 0.1, None)
    with pytest.raises(AllExcludedError, match=r"2 consecutive rounds \(up to round 13"):
        guard.after_round({"round": 13, "participants": 0, "excluded_clients": 2}, 0.1, None)


@pytest.mark.parametrize("dp", [{}, dict(dp_mode="central", dp_clip_norm=0.05, dp_noise_multiplier=1.0)])
def test_a_poisson_run_with_many_empty_rounds_finishes(tmp_path, dp):
    """N = 8, q = 1/8: runs of 3 or more empty rounds are common (they stopped the run with AllExcludedError)."""
    trainer = tiny_run(tmp_path, num_clients=8, clients_per_round=1, client_sampling="poisson", num_rounds=6,
                       seed=9, dp_reproducible_noise=bool(dp), **dp)
    counts = [h["participants"] for h in trainer.federated_history]
    assert counts == [0, 0, 0, 0, 1, 0]  # seed 9's cohort sizes (round_clients): 4 empty rounds in a row


def test_guard_zero_never_stops():
    guard = ExclusionGuard(0)
    for r in range(10):
        guard.after_round({"round": r + 1, "participants": 0, "excluded_clients": 1}, 0.1, 1.0)


def test_a_run_whose_clients_are_all_excluded_stops_naming_the_cause(digits, tmp_path):
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=5, local_steps=1, partition="iid",
                  max_update_norm=1e-9, max_excluded_rounds=2)
    trainer = digit_trainer(tiny_resnet(), digits, args, evaluate=False)
    with pytest.raises(AllExcludedError, match="2 consecutive rounds.*learning_rate.*max_update_norm"):
        trainer.train()
    assert len(trainer.federated_history) == 1  # stopped after round 2, before recording it


def test_a_huge_learning_rate_is_not_reported_as_success(digits, tmp_path):
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=4, local_steps=3, partition="iid",
                  local_optimizer="sgd", learning_rate=1e12, max_grad_norm=0)
    trainer = digit_trainer(tiny_resnet(), digits, args, evaluate=False)
    with pytest.raises(AllExcludedError, match=r"learning_rate` \(1e\+12\)"):
        trainer.train()
