from __future__ import annotations

import json
import os

import numpy as np

from fedhf.metrics import accuracy_metrics, plot_history, write_json_atomic
from fedhf.metrics.history import is_quality_metric, plotted_metric


def test_quality_metrics_exclude_loss_timings_and_trls_diagnostics():
    keys = ["eval_loss", "eval_model_preparation_time", "eval_runtime", "eval_samples_per_second", "eval_accuracy",
            "eval_num_tokens", "eval_entropy", "eval_mean_token_accuracy"]  # the last three: trl's SFT evaluation
    assert [k for k in keys if is_quality_metric(k)] == ["eval_accuracy", "eval_mean_token_accuracy"]


def test_accuracy_from_logits():
    class Pred:
        predictions = np.array([[0.1, 0.9], [2.0, 1.0], [0.0, 3.0]])
        label_ids = np.array([1, 1, 1])

    assert accuracy_metrics(Pred()) == {"accuracy": 2 / 3}


def test_history_json_is_replaced_whole_and_plotted(tmp_path):
    history = [{"round": 0, "communicated_MB": 0.0, "eval_loss": 1.1, "eval_accuracy": 0.3},
               {"round": 1, "communicated_MB": 2.0, "train_loss": 0.9, "eval_loss": 1.0, "eval_accuracy": 0.5}]
    path = tmp_path / "h.json"
    write_json_atomic(history, str(path))
    write_json_atomic(history[:1], str(path))
    assert json.loads(path.read_text()) == history[:1]
    assert [p.name for p in tmp_path.iterdir()] == ["h.json"]  # no temporary file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # an ordinary file, not mkstemp's 0600
    assert plot_history(history, str(tmp_path / "h.png"), title="fedavg: run") == str(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000


def test_the_plot_shows_an_accuracy_before_perplexity():
    llm = [{"round": 0, "eval_loss": 6.2, "eval_perplexity": 488.3, "eval_runtime": 9.0,
            "eval_generation_accuracy": 0.0}]
    assert plotted_metric(llm) == "eval_generation_accuracy"
    assert plotted_metric([{"round": 0, "eval_loss": 6.2, "eval_perplexity": 488.3}]) == "eval_perplexity"
    assert plotted_metric([{"round": 1, "train_loss": 0.5}]) == "eval_loss"


def test_the_plot_prefers_the_task_metric_to_trls_token_accuracy():
    trl = [{"round": 1, "eval_loss": 3.0, "eval_mean_token_accuracy": 0.1, "eval_generation_accuracy": 0.2}]
    assert plotted_metric(trl) == "eval_generation_accuracy"


def test_a_dp_plot_names_delta_and_has_no_legend_entry_for_the_undrawn_train_loss(tmp_path, monkeypatch):
    """Under DP train_loss is NaN (not released): no line, so no legend entry; the title gives (epsilon, delta)."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    history = [{"round": r, "communicated_MB": float(r), "train_loss": float("nan"), "eval_loss": 1.0 / r,
                "eval_accuracy": 0.1 * r, "dp_epsilon": 1.5 * r} for r in (1, 2)]
    plot_history(history, str(tmp_path / "dp.png"), title="fedavg: dp", dp_delta=1.88e-3)
    (fig,) = figures
    assert fig._suptitle.get_text() == "fedavg: dp\nclient-level DP: epsilon 3 at delta 0.0019 spent after round 2"
    labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert labels and "train_loss" not in labels and set(labels) == {"eval_accuracy", "eval_loss"}


def test_rounds_are_whole_numbers_on_the_plot(tmp_path, monkeypatch):
    """A few rounds would otherwise get matplotlib's fractional ticks (0.5, 1.5, ...)."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    history = [{"round": r, "communicated_MB": 1.5 * r, "eval_loss": 1.0 / (r + 1)} for r in range(4)]
    plot_history(history, str(tmp_path / "h.png"))
    ticks = [t for t in figures[0].axes[0].get_xticks() if 0 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
