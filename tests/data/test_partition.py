"""Partitioners on the real tweet labels: coverage, minimum sizes, determinism, and skew against alpha."""

from __future__ import annotations

import numpy as np
import pytest

from fedhf.data import (dirichlet_partition, iid_partition, label_skew, natural_partition, partition_report,
    save_partition_report)


@pytest.fixture(scope="module")
def labels(tweets):
    return np.asarray(tweets["train"]["label"])


def _covers_every_row_once(parts, n):
    joined = np.concatenate(parts)
    assert len(joined) == n
    assert np.array_equal(np.sort(joined), np.arange(n))


@pytest.mark.parametrize("alpha, clients, min_size", [(0.1, 5, 5), (0.5, 10, 10), (10.0, 20, 30)])
def test_dirichlet_covers_every_row_once_and_honours_min_size(labels, alpha, clients, min_size):
    parts = dirichlet_partition(labels, clients, alpha, seed=1, min_partition_size=min_size, max_retries=1000)
    assert len(parts) == clients
    _covers_every_row_once(parts, len(labels))
    assert min(len(p) for p in parts) >= min_size


def test_same_seed_same_partition_other_seed_other_partition(labels):
    a = dirichlet_partition(labels, 10, 0.3, seed=7)
    b = dirichlet_partition(labels, 10, 0.3, seed=7)
    c = dirichlet_partition(labels, 10, 0.3, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_smaller_alpha_gives_more_label_skew(labels):
    skew = {alpha: np.mean([label_skew(dirichlet_partition(labels, 10, alpha, seed=s), labels) for s in range(5)])
            for alpha in (0.05, 0.3, 1.0, 100.0)}
    assert skew[0.05] > skew[0.3] > skew[1.0] > skew[100.0]
    assert skew[100.0] < 0.1 and skew[0.05] > 0.4


def test_impossible_min_size_fails_with_a_fix(labels):
    with pytest.raises(ValueError, match="dirichlet_alpha.*num_clients|Raise `dirichlet_alpha`"):
        dirichlet_partition(labels, 50, 0.01, seed=0, min_partition_size=20, max_retries=5)


def test_iid_is_balanced_and_covers(labels):
    parts = iid_partition(len(labels), 7, seed=0)
    _covers_every_row_once(parts, len(labels))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert label_skew(parts, labels) < 0.1


def test_natural_makes_one_client_per_value():
    users = ["b", "a", "b", "c", "a", "a"]
    parts = natural_partition(users, 3)
    assert [p.tolist() for p in parts] == [[1, 4, 5], [0, 2], [3]]
    with pytest.raises(ValueError, match="num_clients=3"):
        natural_partition(users, 4)


def test_report_counts_and_files(labels, tmp_path):
    parts = dirichlet_partition(labels, 5, 0.3, seed=0)
    report = partition_report(parts, labels, ["negative", "neutral", "positive"])
    counts = np.asarray(report["counts"])
    assert counts.shape == (5, 3)
    assert counts.sum() == len(labels)
    assert np.array_equal(counts.sum(0), np.bincount(labels, minlength=3))
    written = save_partition_report(report, str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in written] == ["partition.json", "partition.png"]
