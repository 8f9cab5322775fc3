"""The per-round history of a federated run: written as JSON, plotted against rounds and communicated MB."""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import List, Optional


def write_json_atomic(obj, path: str) -> None:
    """Write to a temporary file beside ``path`` and rename it over, so readers never see half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; a history is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


#: trl's evaluation diagnostics: the tokens trained on so far and the mean predictive entropy, not a quality measure
DIAGNOSTICS = ("eval_num_tokens", "eval_entropy")


def is_quality_metric(key: str) -> bool:
    """eval_accuracy, eval_f1, ... -- not the loss, not Trainer's timing entries, not trl's diagnostics."""
    return key.startswith("eval_") and key not in ("eval_loss", *DIAGNOSTICS) and not key.endswith(
        ("_runtime", "_per_second", "_preparation_time"))


def plotted_metric(history: List[dict]) -> str:
    """The eval metric a plot shows: the task's generation accuracy when a GenerationEvalCallback scored one (not
    trl's token accuracy), else the first accuracy-type one (an LLM run's accuracy rather than its perplexity,
    whose round-0 value flattens the curve), else the first quality metric, else the eval loss."""
    keys = [k for h in history for k in h if is_quality_metric(k)]
    if "eval_generation_accuracy" in keys:
        return "eval_generation_accuracy"
    return next((k for k in keys if "accuracy" in k), keys[0] if keys else "eval_loss")


def plot_history(history: List[dict], path: str, metric: Optional[str] = None,
                 title: Optional[str] = None, dp_delta: Optional[float] = None) -> Optional[str]:
    """Eval metric and train/eval loss against rounds, against total communicated MB (up + down) and, with the
    simulated clock, against simulated seconds, under ``title`` (the algorithm and run; under DP with the epsilon
    spent, at ``dp_delta``), the legends below the curves.

    Returns the path written, or None when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return None
    evals = [h for h in history if any(k.startswith("eval_") for k in h)]
    metric = metric or plotted_metric(evals)
    panels = [("round", "round"), ("communicated_MB", "communicated MB (up + down)")]
    if any("sim_time_s" in h for h in history):  # the simulated clock (fedhf/trainer/hooks/clock.py)
        panels.append(("sim_time_s", "simulated seconds"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.4))
    for ax, (x_key, x_label) in zip(axes, panels):
        xs = [h[x_key] for h in evals if metric in h]
        ax.plot(xs, [h[metric] for h in evals if metric in h], "o-", color="tab:blue", label=metric)
        ax.set_xlabel(x_label)
        if x_key == "round":  # rounds are whole numbers
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(metric, color="tab:blue")
        loss_ax = ax.twinx()
        train = [h for h in history if "train_loss" in h and math.isfinite(h["train_loss"])]  # NaN under DP
        if train:  # a legend entry only for a line that is drawn
            loss_ax.plot([h[x_key] for h in train], [h["train_loss"] for h in train], "-", color="tab:red",
                         alpha=0.6, label="train_loss")
        if metric != "eval_loss":
            loss_ax.plot([h[x_key] for h in evals if "eval_loss" in h], [h["eval_loss"] for h in evals if "eval_loss" in h],
                         "--", color="tab:red", label="eval_loss")
        loss_ax.set_ylabel("loss", color="tab:red")
        handles = ax.get_legend_handles_labels()[0] + loss_ax.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize="small")
    spent = [h for h in history if "dp_epsilon" in h]
    lines = [title] if title else []
    if spent:  # client-level DP: the privacy spent by the run so far
        lines.append(f"client-level DP: epsilon {spent[-1]['dp_epsilon']:.3g}"
                     + (f" at delta {dp_delta:.2g}" if dp_delta is not None else "")
                     + f" spent after round {spent[-1]['round']}")
    if lines:
        fig.suptitle("\n".join(lines), fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
