"""compute_metrics functions that work offline (``evaluate.load`` needs the Hub); pass them to
``FederatedTrainer(compute_metrics=...)``. The GLUE metrics are computed as the GLUE ``evaluate`` module does,
checked against hand computations in tests/metrics/test_classification.py."""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np


def accuracy_metrics(eval_pred) -> dict:
    """Accuracy from an ``EvalPrediction`` of classification logits (GLUE SST-2's metric too)."""
    logits, labels = eval_pred.predictions, eval_pred.label_ids
    if isinstance(logits, tuple):
        logits = logits[0]
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def accuracy(predictions, references) -> float:
    return float(np.mean(np.asarray(predictions) == np.asarray(references)))


def binary_f1(predictions, references) -> float:
    """F1 of the positive class 1 = 2 TP / (2 TP + FP + FN); 0 when there is no positive at all."""
    p, r = np.asarray(predictions) == 1, np.asarray(references) == 1
    tp, fp, fn = np.sum(p & r), np.sum(p & ~r), np.sum(~p & r)
    return float(2 * tp / (2 * tp + fp + fn)) if tp + fp + fn else 0.0


def matthews_corrcoef(predictions, references) -> float:
    """Matthews correlation, multiclass form (Gorodkin, 2004; sklearn's): with confusion matrix C, s = #rows,
    c = trace, p_k / t_k = predicted / true counts, (c s - p.t) / sqrt((s^2 - p.p)(s^2 - t.t)); 0 if undefined."""
    _, codes = np.unique(np.concatenate([predictions, references]), return_inverse=True)
    pred, true = np.split(codes, 2)
    p, t = np.bincount(pred, minlength=codes.max() + 1), np.bincount(true, minlength=codes.max() + 1)
    s, c = len(true), np.sum(pred == true)
    denominator = np.sqrt(float(s * s - p @ p) * float(s * s - t @ t))
    return float((c * s - p @ t) / denominator) if denominator else 0.0


def pearson(x, y) -> float:
    x, y = np.asarray(x, np.float64) - np.mean(x), np.asarray(y, np.float64) - np.mean(y)
    return float(x @ y / np.sqrt((x @ x) * (y @ y)))


def average_ranks(x) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span (scipy's rankdata 'average')."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]


def spearman(x, y) -> float:
    return pearson(average_ranks(x), average_ranks(y))


def glue_scores(metric: str, predictions, references) -> Dict[str, float]:
    if metric == "correlation":
        return {"pearson": pearson(predictions, references), "spearmanr": spearman(predictions, references)}
    if metric == "matthews":
        return {"matthews_correlation": matthews_corrcoef(predictions, references)}
    scores = {"accuracy": accuracy(predictions, references)}
    if metric == "f1":
        scores["f1"] = binary_f1(predictions, references)
    return scores


def glue_compute_metrics(metric: str) -> Callable:
    """Trainer's ``compute_metrics`` for a task: argmax of the logits, or the single regression output."""
    def compute(eval_pred) -> Dict[str, float]:
        logits = eval_pred.predictions[0] if isinstance(eval_pred.predictions, tuple) else eval_pred.predictions
        predictions = logits[:, 0] if metric == "correlation" else np.argmax(logits, axis=-1)
        return glue_scores(metric, predictions, eval_pred.label_ids)
    return compute
