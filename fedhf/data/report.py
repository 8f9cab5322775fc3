"""How skewed a partition is: per-client x key-value counts (the key is the label column by default, or a derived
key: fedhf/data/keys.py) and client sizes, as JSON and a PNG (heatmap beside a bar chart of sizes)."""

from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

import numpy as np


def partition_counts(parts: List[np.ndarray], labels: Sequence, classes: Optional[Sequence] = None) -> np.ndarray:
    """counts[i, c] = rows of class c held by client i (``classes``, default: the values present, sorted)."""
    labels = np.asarray(labels)
    classes = np.unique(labels) if classes is None else classes
    return np.stack([np.array([(labels[p] == c).sum() for c in classes]) for p in parts])


def label_skew(parts: List[np.ndarray], labels: Sequence) -> float:
    """Mean total-variation distance between each client's class mix and the global mix (0 = IID, 1 = disjoint)."""
    counts = partition_counts(parts, labels).astype(float)
    global_mix = counts.sum(0) / counts.sum()
    client_mix = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    return float(0.5 * np.abs(client_mix - global_mix).sum(1).mean())


def partition_report(parts: List[np.ndarray], labels: Optional[Sequence], class_names: Optional[list] = None) -> dict:
    report = {"num_clients": len(parts), "sizes": [int(len(p)) for p in parts]}
    if labels is not None:
        # A ClassLabel's classes are 0..len(names)-1, rows or not: a class with no rows is a column of zeros.
        classes = np.arange(len(class_names)) if class_names else np.unique(np.asarray(labels))
        counts = partition_counts(parts, labels, classes)
        names = class_names or [str(c) for c in classes]
        report.update(classes=[str(n) for n in names], counts=counts.tolist(), label_skew=label_skew(parts, labels))
    return report


def save_partition_report(report: dict, directory: str) -> List[str]:
    """Write partition.json and, when matplotlib is installed, partition.png."""
    os.makedirs(directory, exist_ok=True)
    written = [os.path.join(directory, "partition.json")]
    with open(written[0], "w") as f:
        json.dump(report, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    written.append(os.path.join(directory, "partition.png"))
    _plot(report, written[-1], plt)
    return written


def _plot(report: dict, path: str, plt) -> None:
    """Rows per client and key value (when the report has a key) beside the clients' sizes (and held-out rows)."""
    from matplotlib.ticker import MaxNLocator

    sizes = np.asarray(report["sizes"])
    counts = np.asarray(report["counts"]) if "counts" in report else None
    width = 0 if counts is None else max(3, 0.5 * counts.shape[1] + 1.5)
    fig, axes = plt.subplots(1, 1 if counts is None else 2, squeeze=False,
                             figsize=(width + 3.5, max(3, 0.25 * len(sizes) + 1.5)),
                             gridspec_kw={"width_ratios": [1] if counts is None else [width, 3]})
    if counts is not None:
        ax = axes[0, 0]
        image = ax.imshow(counts, aspect="auto", cmap="viridis")
        ax.set_xticks(range(counts.shape[1]), report["classes"], rotation=45, ha="right")
        key = report.get("key", "class").replace("`", "")  # the key's name is markdown (for the card)
        ax.set_xlabel(key)
        ax.set_ylabel("client")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # clients are whole numbers
        ax.set_title(f"rows per client and {key}\nlabel skew {report['label_skew']:.2f}: mean TV distance\nto the "
                     "global mix (0 IID, 1 disjoint)", fontsize="medium")
        fig.colorbar(image, ax=ax)
    ax = axes[0, -1]
    ax.barh(range(len(sizes)), sizes, label="train")
    if "eval_sizes" in report:
        ax.barh(range(len(sizes)), report["eval_sizes"], left=sizes, label="held out")
        ax.legend(fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("rows")
    ax.set_ylabel("client")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("client sizes")
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")  # nothing clipped at the figure's edge
    plt.close(fig)
