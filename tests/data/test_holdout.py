"""Held-out rows per client: disjoint from the training rows, a fixed fraction, seeded, on the tweets split."""

from __future__ import annotations

import numpy as np
import pytest

from fedhf.data import dirichlet_partition, hold_out
from fedhf.data.holdout import held_out_count


@pytest.fixture(scope="module")
def parts(tweets):
    return dirichlet_partition(np.asarray(tweets["train"]["label"]), 8, 0.3, seed=0, min_partition_size=10)


def test_held_out_rows_are_a_fixed_fraction_and_disjoint_from_training(parts):
    train, held = hold_out(parts, 0.2, seed=0)
    for rows, t, h in zip(parts, train, held):
        assert len(h) == max(1, round(0.2 * len(rows)))
        assert np.intersect1d(t, h).size == 0
        assert np.array_equal(np.sort(np.concatenate([t, h])), np.sort(rows))
    assert held_out_count(7, 0.01) == 1 and held_out_count(50, 0.1) == 5 and held_out_count(50, 0.0) == 0


def test_held_out_rows_are_seeded(parts):
    a, b, c = hold_out(parts, 0.2, seed=0)[1], hold_out(parts, 0.2, seed=0)[1], hold_out(parts, 0.2, seed=1)[1]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_no_fraction_holds_nothing_out(parts):
    train, held = hold_out(parts, 0.0, seed=0)
    assert all(np.array_equal(t, p) for t, p in zip(train, parts)) and all(len(h) == 0 for h in held)


def test_a_client_left_with_no_training_rows_is_refused():
    with pytest.raises(ValueError, match="Client 1 has 1 row.*`client_eval_fraction`=0.1.*`min_partition_size`"):
        hold_out([np.arange(10), np.array([10])], 0.1, seed=0)
