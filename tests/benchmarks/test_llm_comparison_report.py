"""benchmarks/llm_comparison_report.py's seed statistics against hand computations: the 95 % t-interval of a mean,
the paired difference to FedAvg over the seeds both finished, when a difference counts as resolved, the committed
result line; and benchmarks/llm_comparison.py's choice of lr on stored runs."""

from __future__ import annotations

import math
import sys

import pytest

from tests.benchmarks.importing import BENCHMARKS, import_benchmark


@pytest.fixture(scope="module")
def report():
    return import_benchmark("llm_comparison_report")


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


def _row(name, scores, status="chosen"):
    return {"name": name, "status": status, "test": {"loglik_accuracy": list(scores)},
            "records_by_seed": {s: {"test": {"loglik_accuracy": v}} for s, v in enumerate(scores)}}


def test_the_result_line_names_the_best_mean_and_its_paired_difference_only_when_nothing_is_pending(report):
    rows = {"fedavg": _row("FedAvg", [0.40, 0.42, 0.38]), "fedmuon": _row("FedMuon", [0.50, 0.53, 0.47]),
            "scaffold": _row("SCAFFOLD", [0.45, 0.30, 0.41])}
    line = report.result_line(rows)  # FedMuon - FedAvg per seed: 0.10, 0.11, 0.09 (mean 0.10, s = 0.01)
    assert line.startswith("gemma_comparison algorithms=3 seeds=3 best=FedMuon best_minus_fedavg=+0.100 ci95=")
    assert float(line.rsplit("=", 1)[1]) == pytest.approx(4.302653 * 0.01 / math.sqrt(3), abs=5e-4)
    rows["scaffold"] = _row("SCAFFOLD", [0.45, 0.30])  # a seed missing: no best is claimed
    assert report.result_line(rows) == "gemma_comparison algorithms=3 pending_runs=1"
    rows["scaffold"] = _row("SCAFFOLD", [0.45], status="default lr (bracket pending)")  # 2 bracket runs + 3 seeds
    rows["scaffold"]["bracket"] = {0.03: None, 0.1: {"loglik_accuracy": 0.45}, 0.3: None}
    assert report.pending_cells(rows) == 4  # the 2 bracket runs missing, then seeds 1 and 2 at the chosen lr
    rows["scaffold"]["bracket"][0.3] = {"loglik_accuracy": 0.4}  # half the bracket was done: 1 + 2 pending, not 5
    assert report.pending_cells(rows) == 3
    rows["scaffold"]["bracket"] = {0.03: None, 0.1: None, 0.3: None}
    assert report.pending_cells(rows) == 5
    assert report.result_line(rows) == "gemma_comparison algorithms=3 pending_runs=5"


def test_the_lr_is_chosen_by_validation_loglik_accuracy_then_the_answers_log_probability(tmp_path, report):
    comparison = sys.modules["llm_comparison"]  # imported by the report
    from fedhf.metrics import write_json_atomic

    labels = list(comparison.bracket("fedavg").values())  # x1/3, x1, x3
    scores = {labels[0]: (0.50, -0.9), labels[1]: (0.50, -0.7), labels[2]: (0.45, -0.1)}
    for label, (acc, logprob) in list(scores.items())[:2]:
        settings = comparison.run_settings(label, 0)
        write_json_atomic({"settings": settings, "validation": {"loglik_accuracy": acc,
                                                                "loglik_answer_logprob": logprob}},
                          comparison.run_path(settings, str(tmp_path)))
    assert comparison.chosen_label("fedavg", str(tmp_path)) is None  # one bracket run missing
    acc, logprob = scores[labels[2]]
    settings = comparison.run_settings(labels[2], 0)
    write_json_atomic({"settings": settings, "validation": {"loglik_accuracy": acc, "loglik_answer_logprob": logprob}},
                      comparison.run_path(settings, str(tmp_path)))
    assert comparison.chosen_label("fedavg", str(tmp_path)) == labels[1]  # the tie on accuracy goes to -0.7


def test_a_stored_run_is_stale_when_its_lr_or_its_algorithms_defaults_change(tmp_path, report):
    """A bare name trains at its default lr: a changed default (fedhf's, or a server-side one such as DiLoCo's
    outer lr) must not reuse the runs made at the old one."""
    comparison = sys.modules["llm_comparison"]
    from fedhf.metrics import write_json_atomic

    settings = comparison.run_settings("diloco", 1)
    assert settings["learning_rate"] == comparison.default_lr("diloco") and "ServerMomentum(lr=0.7" in settings["defaults"]
    assert comparison.run_settings("diloco@learning_rate=0.0012", 1)["learning_rate"] == 0.0012
    for stale in ({"learning_rate": 1e-3}, {"defaults": settings["defaults"].replace("lr=0.7", "lr=0.5")}, {}):
        write_json_atomic({"settings": {**settings, **stale}}, comparison.run_path(settings, str(tmp_path)))
        assert (comparison.load_run("diloco", 1, str(tmp_path)) is None) == bool(stale)
