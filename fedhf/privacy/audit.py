"""The statistics of an empirical privacy audit: from canary scores to an epsilon lower bound (pure functions).

Two kinds of evidence, both compared with the epsilon a run reports (benchmarks/privacy_audit.py runs them):

* **A threshold test over many trials** (Jagielski, Ullman, Oprea, NeurIPS 2020; Nasr et al., IEEE S&P 2021): a
  score for each trial "without" and "with" the canary, a threshold chosen on half the trials, the false-positive and
  false-negative rates measured on the other half with Clopper-Pearson upper ends FPR+ and FNR+ (each one-sided
  97.5 %, so both hold together with >= 95 %); an (epsilon, delta)-DP mechanism satisfies
  epsilon >= log((1 - delta - FNR+) / FPR+) and the symmetric log((1 - delta - FPR+) / FNR+). Distribution-free.
* **Many canaries in one run** (Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning",
  ICLR 2024): each canary's score in the released model, a group per side of the neighbouring relation. Where the
  scores are Gaussian with one variance (a canary's fixed, clipped update plus the Gaussian noise, as the audit's
  runs make them) the two sides are a Gaussian mechanism of mu = (mean_a - mean_b) / sigma, the mu-GDP of Dong,
  Roth and Su (JRSS-B 2022), and its (epsilon, delta) curve is exact: delta(eps) = Phi(-eps/mu + mu/2) -
  e^eps Phi(-eps/mu - mu/2). The two-sample t statistic has a noncentral t distribution whose noncentrality is
  mu / sqrt(1/n_a + 1/n_b), which gives an exact lower confidence end mu_lo, and epsilon(mu_lo, delta) is a lower
  bound on the release's epsilon at that delta (post-processing: the scores are a function of the release).
  The one-run bound of Steinke, Nasr and Jagielski (NeurIPS 2023; distribution-free, from the number of correct
  guesses) is :func:`one_run_guess_bound`; it is far looser for Gaussian mechanisms, so it is printed beside.
"""

from __future__ import annotations

import math
from typing import Tuple

import numpy as np

CONFIDENCE = 0.95
MU_CAP = 40.0  # a larger mu is reported as 40 (epsilon in the hundreds): separation beyond any claim


# ------------------------------------------------------------------ a threshold test over many trials
def rates_upper(errors, trials: int, confidence: float = CONFIDENCE) -> np.ndarray:
    """Clopper-Pearson: the upper ends of the two-sided ``confidence`` intervals of error rates (errors of
    ``trials``); 1 where every trial erred."""
    from scipy.stats import beta

    errors = np.asarray(errors)
    inside = np.minimum(errors, trials - 1)
    upper = beta.ppf(1.0 - (1.0 - confidence) / 2.0, inside + 1, trials - inside)
    return np.where(errors >= trials, 1.0, upper)


def threshold_bounds(without: np.ndarray, with_: np.ndarray, thresholds: np.ndarray, delta: float) -> np.ndarray:
    """The two lower bounds at each threshold ("with" above it), shape (2, thresholds): from FPR+ (the form
    log((1 - delta - FNR+) / FPR+)) and from FNR+ (the symmetric one); 0 where vacuous."""
    false_positives = len(without) - np.searchsorted(np.sort(without), thresholds, side="right")
    false_negatives = np.searchsorted(np.sort(with_), thresholds, side="right")
    fpr, fnr = rates_upper(false_positives, len(without)), rates_upper(false_negatives, len(with_))
    forms = np.stack([(1.0 - delta - fnr, fpr), (1.0 - delta - fpr, fnr)])  # (form, numerator/denominator, t)
    return np.where(forms[:, 0] > forms[:, 1], np.log(np.maximum(forms[:, 0], 1e-300) / forms[:, 1]), 0.0)


def threshold_lower_bound(without: np.ndarray, with_: np.ndarray, delta: float) -> Tuple[float, dict]:
    """The threshold and form chosen on the first half of each world's trials (the largest bound there, over every
    midpoint between two of their scores), the bound measured on the second half (choosing on the same trials would
    bias it upwards)."""
    half_out, half_in = len(without) // 2, len(with_) // 2
    choose_out, choose_in = without[:half_out], with_[:half_in]
    scores = np.unique(np.concatenate([choose_out, choose_in]))
    candidates = (scores[1:] + scores[:-1]) / 2.0
    chosen = threshold_bounds(choose_out, choose_in, candidates, delta)
    form, index = np.unravel_index(int(np.argmax(chosen)), chosen.shape)
    threshold = float(candidates[index])
    test_out, test_in = without[half_out:], with_[half_in:]
    lb = float(threshold_bounds(test_out, test_in, np.array([threshold]), delta)[form, 0])
    detail = dict(threshold=threshold, false_positives=int((test_out > threshold).sum()),
                  false_negatives=int((test_in <= threshold).sum()), per_world=len(test_out))
    return lb, detail


# ------------------------------------------------------------------ many canaries in one run
def gaussian_epsilon(mu: float, delta: float) -> float:
    """The epsilon of a mu-GDP mechanism (a Gaussian mechanism of sensitivity / std = mu) at ``delta``: the root of
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) = delta; 0 where delta is reached at eps = 0."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if mu <= 0:
        return 0.0

    def excess(eps: float) -> float:  # delta(eps) - delta, with e^eps Phi(.) as exp(eps + logcdf) (no overflow)
        return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)) - delta)

    if excess(0.0) <= 0:
        return 0.0
    high = mu * mu / 2 + mu * 10 + 10  # delta(high) < 1e-20 for every mu
    return float(brentq(excess, 0.0, high, xtol=1e-9))


def mu_lower_bound(a: np.ndarray, b: np.ndarray, confidence: float = CONFIDENCE) -> Tuple[float, float]:
    """(mu_hat, mu_lo): the estimate of (mean_a - mean_b) / sigma from two samples of Gaussian scores with one
    variance, and its exact one-sided lower ``confidence`` end from the noncentral t distribution of the pooled
    two-sample t statistic; capped at :data:`MU_CAP`; 0 where the data show no separation."""
    from scipy.optimize import brentq
    from scipy.stats import nct

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n_a, n_b = len(a), len(b)
    df = n_a + n_b - 2
    pooled = math.sqrt((((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()) / df)
    scale = math.sqrt(1.0 / n_a + 1.0 / n_b)
    gap = float(a.mean() - b.mean())
    if pooled == 0.0 or gap / pooled > MU_CAP * 10:
        return (MU_CAP, MU_CAP) if gap > 0 else (0.0, 0.0)
    t = gap / (pooled * scale)
    mu_hat = gap / pooled
    tail = 1.0 - confidence

    def above(noncentrality: float) -> float:  # P[T >= t] at this noncentrality, minus the tail
        return float(nct.sf(t, df, noncentrality) - tail)

    if above(0.0) >= 0:  # not significant even against mu = 0
        return max(mu_hat, 0.0), 0.0
    high = MU_CAP / scale
    if above(high) < 0:
        return min(mu_hat, MU_CAP), MU_CAP
    return min(mu_hat, MU_CAP), float(brentq(above, 0.0, high, xtol=1e-9)) * scale


def canary_lower_bound(a: np.ndarray, b: np.ndarray, delta: float,
                       confidence: float = CONFIDENCE) -> Tuple[float, dict]:
    """The epsilon lower bound at ``delta`` from two groups of canary scores (a: the side that moves the score up):
    epsilon(mu_lo, delta)."""
    mu_hat, mu_lo = mu_lower_bound(a, b, confidence)
    return gaussian_epsilon(mu_lo, delta), dict(mu_hat=mu_hat, mu_lo=mu_lo, canaries=len(a) + len(b))


def one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Steinke, Nasr, Jagielski (2023), Theorem 5.2: the probability of >= v correct guesses of r (m canaries, each
    in with probability 1/2) under an (eps, delta)-DP mechanism is at most P[Binomial(r, e^eps/(1+e^eps)) >= v]
    + 2 m delta max_i P[v > Binomial >= v - i] / i."""
    from scipy.stats import binom

    p = 1.0 / (1.0 + math.exp(-eps))
    tail = float(binom.sf(v - 1, r, p))
    steps = np.arange(1, v + 1)
    alpha = float(np.max(np.cumsum(binom.pmf(v - steps, r, p)) / steps)) if v > 0 else 0.0
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def one_run_guess_bound(m: int, r: int, v: int, delta: float, confidence: float = CONFIDENCE) -> float:
    """The largest eps that ``v`` correct guesses of ``r`` (of ``m`` canaries) reject at ``confidence``; 0 if none."""
    tail = 1.0 - confidence
    if r == 0 or one_run_p_value(m, r, v, 0.0, delta) >= tail:
        return 0.0
    low, high = 0.0, 1.0
    while one_run_p_value(m, r, v, high, delta) < tail and high < 100:
        low, high = high, high * 2
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if one_run_p_value(m, r, v, middle, delta) < tail else (low, middle)
    return low


def guesses(scores: np.ndarray, truth: np.ndarray, fraction: float) -> Tuple[int, int]:
    """(r, v): guess the side of the ``fraction`` of canaries whose score is farthest from the middle of all scores
    (the sign of score - median), and count the correct guesses; ``truth`` is +1 / -1 per canary."""
    scores, truth = np.asarray(scores, dtype=np.float64), np.asarray(truth)
    centred = scores - np.median(scores)
    r = max(int(round(fraction * len(scores))), 1)
    chosen = np.argsort(-np.abs(centred), kind="stable")[:r]
    return r, int((np.sign(centred[chosen]) == truth[chosen]).sum())
