"""compute_metrics functions that work offline; pass them to FederatedTrainer(compute_metrics=...)."""

from __future__ import annotations

import numpy as np


def accuracy_metrics(eval_pred) -> dict:
    """Accuracy from an ``EvalPrediction`` of classification logits (GLUE SST-2's metric too)."""
    logits, labels = eval_pred.predictions, eval_pred.label_ids
    if isinstance(logits, tuple):
        logits = logits[0]
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}
