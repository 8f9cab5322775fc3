"""fedhf/privacy/audit.py: the audit's statistics against hand computations and dp-accounting."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from scipy.stats import binom

from fedhf.privacy.audit import (MU_CAP, canary_lower_bound, gaussian_epsilon, guesses, mu_lower_bound,
                                 one_run_guess_bound, one_run_p_value, threshold_lower_bound)


def test_perfectly_separated_trials_give_the_clopper_pearson_bound_by_hand():
    n = 400  # per world; 200 choose the threshold, 200 measure it
    without, with_ = np.arange(n, dtype=float), np.arange(n, dtype=float) + 10 * n
    lb, detail = threshold_lower_bound(without, with_, 1e-2)
    upper = 1 - 0.025 ** (1 / (n // 2))  # Clopper-Pearson's upper end for 0 errors of 200, two-sided 95 %
    assert detail["false_positives"] == detail["false_negatives"] == 0
    assert lb == pytest.approx(math.log((1 - 1e-2 - upper) / upper), rel=1e-9)
    assert threshold_lower_bound(without, without.copy(), 1e-2)[0] == 0.0  # the same scores: nothing to bound


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0, 4.0])
def test_the_epsilon_of_mu_gdp_is_dp_accountings_gaussian_mechanism(mu):
    direct = PLDAccountant(value_discretization_interval=1e-4)
    direct.compose(dp_accounting.GaussianDpEvent(1.0 / mu))  # sensitivity 1, std 1/mu
    assert gaussian_epsilon(mu, 1e-5) == pytest.approx(direct.get_epsilon(1e-5), rel=2e-3)
    assert gaussian_epsilon(0.0, 1e-5) == 0.0


def test_the_lower_end_of_mu_covers_the_truth_at_its_confidence():
    rng = np.random.default_rng(0)
    mu, n, runs = 1.5, 100, 400
    below = [mu_lower_bound(rng.normal(mu, 1, n), rng.normal(0, 1, n), 0.9)[1] <= mu for _ in range(runs)]
    assert 0.86 <= np.mean(below) <= 0.94  # exact: 90 % of the lower ends fall below the true mu


def test_identical_groups_give_no_bound_and_exact_separation_the_cap():
    a = np.linspace(-1, 1, 50)
    assert mu_lower_bound(a, a.copy())[1] == 0.0
    lb, detail = canary_lower_bound(np.full(50, 3.0), np.full(50, -3.0), 1e-5)
    assert detail["mu_lo"] == MU_CAP and lb == pytest.approx(gaussian_epsilon(MU_CAP, 1e-5))


def test_the_one_run_p_value_is_the_binomial_tail_plus_the_delta_term_by_hand():
    m, r, v, eps = 100, 10, 9, 1.0
    p = 1 / (1 + math.exp(-eps))
    tail = binom.sf(v - 1, r, p)
    alpha = max(sum(binom.pmf(v - j, r, p) for j in range(1, i + 1)) / i for i in range(1, v + 1))
    assert one_run_p_value(m, r, v, eps, 1e-4) == pytest.approx(tail + 2 * m * 1e-4 * alpha, rel=1e-9)
    # all r guesses right at delta = 0: p^r = 0.05 exactly at the bound
    bound = one_run_guess_bound(1000, 200, 200, 0.0)
    assert (1 / (1 + math.exp(-bound))) ** 200 == pytest.approx(0.05, rel=1e-6)


def test_guesses_take_the_most_extreme_scores_and_count_the_right_sides():
    scores = np.array([5.0, -4.0, 0.1, -0.2, 3.0, 0.0])
    truth = np.array([1, -1, -1, 1, -1, 1])
    assert guesses(scores, truth, 0.5) == (3, 2)  # 5 and -4 right, 3 wrong (the median is 0.05)
