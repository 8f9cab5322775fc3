"""How skewed a partition is: per-client x class counts as JSON and a PNG heatmap."""

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
    """Write partition.json and, when there are labels and matplotlib is installed, partition.png."""
    os.makedirs(directory, exist_ok=True)
    written = [os.path.join(directory, "partition.json")]
    with open(written[0], "w") as f:
        json.dump(report, f, indent=1)
    if "counts" not in report:
        return written
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    counts = np.asarray(report["counts"])
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * counts.shape[1] + 2), max(3, 0.25 * counts.shape[0] + 1.5)))
    image = ax.imshow(counts, aspect="auto", cmap="viridis")
    ax.set_xticks(range(counts.shape[1]), report["classes"], rotation=45, ha="right")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(f"rows per client and class (label skew {report['label_skew']:.2f})")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    written.append(os.path.join(directory, "partition.png"))
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
    return written
