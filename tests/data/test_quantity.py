"""Quantity skew: power-law client sizes computed by hand, alone (IID rows) and with a per-client Dirichlet mix."""

from __future__ import annotations

import numpy as np
import pytest

from fedhf.data import derive_key, label_skew, power_law_sizes, sized_dirichlet_partition, sized_iid_partition


def _covers_every_row_once(parts, n):
    joined = np.concatenate(parts)
    assert len(joined) == n and np.array_equal(np.sort(joined), np.arange(n))


def test_power_law_sizes_by_hand():
    # 100 rows, 4 clients, s=1, m=1: 96 spare rows x (1, 1/2, 1/3, 1/4) / (25/12) = 46.08, 23.04, 15.36, 11.52;
    # floors 46, 23, 15, 11 leave 1 row, which goes to the largest remainder (.52, client 3); + m each.
    assert power_law_sizes(100, 4, 1.0, 1).tolist() == [47, 24, 16, 13]
    # s=2, m=5: 85 spare x (1, 1/4, 1/9) / (49/36) = 62.45, 15.61, 6.94 -> floors 62, 15, 6; 2 rows to .94, .61.
    assert power_law_sizes(100, 3, 2.0, 5).tolist() == [67, 21, 12]
    assert power_law_sizes(100, 4, 0.0, 1).tolist() == [25, 25, 25, 25]


def test_power_law_sizes_on_the_tweets_follow_the_law(tweet_texts):
    n, clients, m = len(tweet_texts), 10, 20
    sizes = power_law_sizes(n, clients, 1.0, m)
    harmonic = sum(1 / k for k in range(1, clients + 1))
    expected = m + (n - clients * m) * (1 / np.arange(1, clients + 1)) / harmonic  # 975.98 ... 115.60
    assert sizes.sum() == n and sizes.min() >= m and np.all(np.diff(sizes) <= 0)
    assert np.abs(sizes - expected).max() < 1
    assert sizes[0] / sizes[-1] == pytest.approx(expected[0] / expected[-1], rel=0.01)  # 8.44 largest/smallest


def test_impossible_minimum_is_refused():
    with pytest.raises(ValueError, match="`min_partition_size`=30 x `num_clients`=4 exceeds the 100 rows"):
        power_law_sizes(100, 4, 1.0, 30)


def test_sized_iid_has_exactly_the_sizes(tweet_texts):
    sizes = power_law_sizes(len(tweet_texts), 10, 1.5, 20)
    parts = sized_iid_partition(sizes, seed=0)
    assert [len(p) for p in parts] == sizes.tolist()
    _covers_every_row_once(parts, len(tweet_texts))


def test_sized_dirichlet_has_the_sizes_is_seeded_and_skews_more_at_lower_alpha(tweet_texts):
    codes = derive_key(tweet_texts, "length", "text", 4).codes
    sizes = power_law_sizes(len(codes), 10, 1.0, 20)
    parts = sized_dirichlet_partition(codes, sizes, 0.1, seed=0)
    assert [len(p) for p in parts] == sizes.tolist()
    _covers_every_row_once(parts, len(codes))
    again, other = sized_dirichlet_partition(codes, sizes, 0.1, seed=0), sized_dirichlet_partition(codes, sizes, 0.1, 1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    skew = {alpha: np.mean([label_skew(sized_dirichlet_partition(codes, sizes, alpha, seed=s), codes)
                            for s in range(3)]) for alpha in (0.1, 1.0, 100.0)}
    assert skew[0.1] > skew[1.0] > skew[100.0]
    assert skew[0.1] > 0.4 and skew[100.0] < 0.15
