"""benchmarks/llm_comparison_report.py's seed statistics against hand computations: the 95 % t-interval of a mean,
the paired difference to FedAvg over the seeds both finished, and when a difference counts as resolved."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def report():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("llm_comparison_report")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_t_interval_by_hand(report):
    mean, half = report.t_interval([0.4, 0.5, 0.6])
    # s = 0.1, n = 3, t_{0.975, 2} = 4.302653 (the t table): 4.302653 * 0.1 / sqrt(3)
    assert mean == pytest.approx(0.5) and half == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-6)
    one = report.t_interval([0.42])
    assert one[0] == pytest.approx(0.42) and math.isnan(one[1])


def test_paired_difference_uses_common_seeds_and_resolves_only_outside_zero(report):
    fedavg = {0: 0.40, 1: 0.42, 2: 0.38}
    better = {0: 0.50, 1: 0.53, 2: 0.47, 3: 0.9}  # seed 3 has no FedAvg twin: left out
    diff = report.paired_difference(better, fedavg)
    d = [0.10, 0.11, 0.09]  # mean 0.10, s = 0.01
    assert diff["seeds"] == [0, 1, 2] and diff["mean"] == pytest.approx(0.10)
    assert diff["ci95"] == pytest.approx(4.302653 * 0.01 / math.sqrt(3), rel=1e-6) and diff["resolved"]
    noisy = report.paired_difference({0: 0.5, 1: 0.3, 2: 0.45}, fedavg)  # d = 0.10, -0.12, 0.07
    assert not noisy["resolved"] and noisy["ci95"] > abs(noisy["mean"])
    assert not report.paired_difference({0: 0.9}, fedavg)["resolved"]  # one seed: no interval, never resolved
    assert sum(d) / 3 == pytest.approx(diff["mean"])
