"""benchmarks/privacy_audit.py, small: through fedhf's own privacy hook, the epsilon lower bound of every honest mode
(central, adaptive, distributed) stays below the epsilon the accountant claims, and both planted breaks (noise from
a seed the auditor knows, clients clipping at 2C under noise calibrated for C) are caught above it; the bound and
the claim match hand computations."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "privacy_audit.py"


@pytest.fixture(scope="module")
def audit():
    spec = importlib.util.spec_from_file_location("privacy_audit", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_honest_modes_stay_below_their_claim_and_both_planted_breaks_are_caught(audit):
    # honest modes need few trials to show lb < claim; the planted ones need 2,000 per world to rise above it
    trials = {"central": 1000, "adaptive": 1000, "distributed": 1000, "planted_seed": 1000, "planted_sens": 4000}
    results = audit.run_audit(trials, cohort=4, seed=0, log=lambda line: None)
    claim = results["central"]["claim"]
    assert 2.0 < claim < 2.6  # z = 1 at delta = 1e-2, one unamplified round
    for mode in audit.HONEST:
        assert results[mode]["claim"] == pytest.approx(claim)  # the hook accounts z = 1 in every mode
        assert results[mode]["lb"] < claim, (mode, results[mode])
    assert results["planted_seed"]["false_positives"] == results["planted_seed"]["false_negatives"] == 0
    for mode in audit.PLANTED:
        assert results[mode]["lb"] > results[mode]["claim"] == pytest.approx(claim), (mode, results[mode])
    line = audit.summary_line(results)
    assert line.startswith("privacy_audit central=") and "planted_sens=" in line.split()[-1]


def test_a_known_seed_is_subtracted_exactly_and_never_errs(audit):
    # seed 2: the subtraction leaves one score in several float64 roundings; a threshold between two of them erred
    result = audit.audit("planted_seed", trials=1000, cohort=4, seed=2)
    assert result["false_positives"] == result["false_negatives"] == 0
    upper = 1 - 0.025 ** (1 / 250)  # Clopper-Pearson's upper end for 0 errors of 250, two-sided 95 %
    assert result["lb"] == pytest.approx(math.log((1 - audit.DELTA - upper) / upper), rel=1e-9)


def test_perfectly_separated_scores_give_the_clopper_pearson_bound_by_hand(audit):
    n = 400  # per world; 200 choose the threshold, 200 measure it
    without, with_ = np.arange(n, dtype=float), np.arange(n, dtype=float) + 10 * n
    lb, detail = audit.epsilon_lower_bound(without, with_)
    upper = 1 - 0.025 ** (1 / (n // 2))  # Clopper-Pearson's upper end for 0 errors of 200, two-sided 95 %
    assert detail["false_positives"] == detail["false_negatives"] == 0
    assert lb == pytest.approx(math.log((1 - audit.DELTA - upper) / upper), rel=1e-9)
    assert audit.epsilon_lower_bound(without, without.copy())[0] == 0.0  # the same scores: nothing to bound


def test_the_claim_is_the_unamplified_gaussian_mechanism(audit):
    direct = PLDAccountant(value_discretization_interval=1e-3)
    direct.compose(dp_accounting.GaussianDpEvent(1.3))
    assert audit.claimed_epsilon(1.3, cohort=7) == pytest.approx(direct.get_epsilon(audit.DELTA), rel=1e-6)
