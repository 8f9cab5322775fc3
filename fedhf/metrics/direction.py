"""Which way a metric improves: the one place fedhf decides it (the best round, the personalised evaluation's
``_worst`` client, a config's ``greater_is_better``).

The metric chosen by ``metric_for_best_model`` goes by ``greater_is_better``, as in Trainer. When the user leaves
``greater_is_better`` unset, TrainingArguments guesses "higher is better" for every name not ending in ``loss``,
which is wrong for an error rate or a regression error (``eval_mse``); :class:`fedhf.FederatedConfig` sets it
from :data:`DIRECTIONS` instead and refuses a name the table does not know, naming the fix. Every other metric
(a personalised evaluation's) goes by the table alone; a name it does not know gets no direction (never a guess).

A name is read word by word (``_`` separated, after the ``eval_`` / ``personal_eval_`` prefixes and a
``_mean``/``_worst``/``_std`` suffix): ``eval_macro_f1`` is an F1, ``eval_token_error_rate`` an error.
"""

from __future__ import annotations

from typing import Optional

LOWER_IS_BETTER = ("loss", "nll", "perplexity", "ppl", "error", "err", "mse", "rmse", "mae", "mape", "wer", "cer",
                   "ter", "distance")
HIGHER_IS_BETTER = ("accuracy", "acc", "f1", "precision", "recall", "auc", "auroc", "bleu", "sacrebleu", "rouge1",
                    "rouge2", "rougel", "rougelsum", "meteor", "chrf", "exact", "em", "matthews", "mcc", "pearson",
                    "pearsonr", "spearman", "spearmanr", "r2", "kappa", "iou", "map", "ndcg", "mrr")
DIRECTIONS = {**{w: False for w in LOWER_IS_BETTER}, **{w: True for w in HIGHER_IS_BETTER}}  # word -> greater
PREFIXES = ("eval_", "personal_eval_")
SUMMARIES = ("_mean", "_worst", "_std")


def base_name(metric: str) -> str:
    """``metric`` without the evaluation prefixes and a personalised summary's suffix (``eval_personal_eval_mse_mean``
    -> ``mse``)."""
    for prefix in PREFIXES:
        if metric.startswith(prefix):
            metric = metric[len(prefix):]
    for suffix in SUMMARIES:
        if metric.endswith(suffix):
            return metric[:-len(suffix)]
    return metric


def is_personal(metric: str) -> bool:
    """A personalised evaluation's metric (``personal_eval_*``, ``eval_`` prefixed or not)."""
    return (metric[len("eval_"):] if metric.startswith("eval_") else metric).startswith("personal_eval_")


def known_direction(metric: str) -> Optional[bool]:
    """True when higher is better, False when lower is, None when the table's words do not say (no word of the
    name in it, or words of both directions)."""
    said = {DIRECTIONS[w] for w in base_name(metric).lower().split("_") if w in DIRECTIONS}
    return said.pop() if len(said) == 1 else None


def default_greater_is_better(metric_for_best_model: str) -> bool:
    """``greater_is_better`` for a config that chose ``metric_for_best_model`` and left the direction unset; raises
    for a name the table does not know."""
    direction = known_direction(metric_for_best_model)
    if direction is None:
        raise ValueError(f"`metric_for_best_model`={metric_for_best_model!r} has no known direction: set "
                         "`greater_is_better=True` (higher is better, e.g. an accuracy) or `greater_is_better=False` "
                         "(lower is better, e.g. a loss or an error rate).")
    return direction


def greater_is_better(metric: str, args) -> Optional[bool]:
    """The direction of ``metric`` in a run with ``args``: ``args.greater_is_better`` for ``metric_for_best_model``
    (the same :func:`base_name`), the table for any other name (None where it does not say)."""
    chosen = args.metric_for_best_model
    if chosen is not None and args.greater_is_better is not None and base_name(metric) == base_name(chosen):
        return bool(args.greater_is_better)
    return known_direction(metric)
