"""Micro-batching (``gradient_accumulation_steps = G``): one local step = one optimizer step over G micro-batches
whose summed gradient equals the gradient of the loss over their union.

The loss a model returns is a mean: per token for causal LMs (and token classifiers), per row for sequence
classifiers. Averaging the G micro-batch means equally (what a naive loop does) is not the union's mean when the
micro-batches hold different numbers of items (completion tokens vary with every batch). Weighting micro-batch i's
mean by ``n_i / N`` (its items over the step's total) gives ``sum_i n_i mean_i / N = sum_i sum_i / N`` exactly, the
mean over the union. This is the gradient-accumulation fix transformers made in 4.46
(https://huggingface.co/blog/gradient_accumulation), applied per optimizer step.
"""

from __future__ import annotations

from typing import List, Mapping, Sequence

import torch

IGNORE_INDEX = -100


def count_items(batch: Mapping[str, torch.Tensor], loss_shifts_labels: bool) -> int:
    """The number of terms the batch's loss averages: labelled tokens (``labels[..., 1:]`` when the loss shifts
    them, as causal LMs do) for token-level labels, rows otherwise."""
    labels = batch.get("labels")
    if labels is None or not torch.is_tensor(labels):
        first = next(v for v in batch.values() if torch.is_tensor(v))
        return int(first.shape[0])
    if labels.dim() >= 2 and labels.dtype in (torch.long, torch.int, torch.int32):
        return int((labels[..., 1:] if loss_shifts_labels else labels).ne(IGNORE_INDEX).sum())
    return int(labels.shape[0])


def micro_batch_weights(batches: Sequence[Mapping[str, torch.Tensor]], loss_shifts_labels: bool) -> List[float]:
    """``n_i / N`` per micro-batch (equal weights if no micro-batch has an item, so nothing divides by zero)."""
    counts = [count_items(b, loss_shifts_labels) for b in batches]
    total = sum(counts)
    if total == 0:
        return [1.0 / len(batches)] * len(batches)
    return [c / total for c in counts]
