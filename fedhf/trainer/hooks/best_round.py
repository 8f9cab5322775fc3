"""The best evaluated round: Trainer's ``metric_for_best_model``/``greater_is_better`` rule over the rounds that were
evaluated, with that round's global trainable tensors kept in memory for ``load_best_model_at_end``.

Trainer keeps the best checkpoint's path and reloads it from disk; a federated round's global model is only the
trainable tensors (LoRA + head, or all weights), so they are kept as a copy (one model's worth of trainable memory)
and need no checkpoint. ``TrainerState.best_metric``/``best_global_step`` are updated as Trainer does, which is what
``EarlyStoppingCallback`` compares against; ``best_model_checkpoint`` names the best round's checkpoint folder once
one is written.

A round checkpoint carries all of it (the ``best_*`` fields in its meta, the kept tensors as tensor groups), so a
resumed run picks the same best round, protects the same checkpoint from ``save_total_limit`` and loads the same
model at the end as an uninterrupted one.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch

from transformers.utils import logging

from ...core.params import TensorDict, load_into, snapshot
from ...metrics.direction import greater_is_better, is_personal
from .base import RoundHook

logger = logging.get_logger(__name__)

STATE_FIELDS = ("best_metric", "best_global_step", "best_model_checkpoint")  # TrainerState's, as Trainer keeps them


def best_metric_key(metric: Optional[str]) -> Optional[str]:
    """The round entry's key of ``metric_for_best_model``: ``eval_<name>`` as Trainer reads it, or a personalised
    evaluation's ``personal_eval_<m>_<summary>`` as it is logged (without an ``eval_`` prefix)."""
    if metric is None:
        return None
    if is_personal(metric):
        return metric[len("eval_"):] if metric.startswith("eval_") else metric
    return metric if metric.startswith("eval_") else f"eval_{metric}"


def check_best_metric(args, callbacks) -> None:
    """A ``personal_eval_*`` ``metric_for_best_model``, refused at ``__init__`` where it could never be returned."""
    metric = best_metric_key(args.metric_for_best_model)
    if metric is None or not is_personal(metric):
        return
    from transformers import EarlyStoppingCallback

    if not args.personalized_eval:
        raise ValueError(f"`metric_for_best_model`={metric!r} is a personalised evaluation's metric, but "
                         "`personalized_eval` is False: set personalized_eval=True (with client_eval_fraction > 0) "
                         "or choose a global metric (e.g. 'eval_loss').")
    if any(isinstance(c, EarlyStoppingCallback) for c in callbacks):
        raise ValueError(f"`metric_for_best_model`={metric!r} with EarlyStoppingCallback: the callback reads only "
                         "the global evaluation's metrics (its on_evaluate), so it would never stop the run: choose a "
                         "global metric (e.g. 'eval_loss') for early stopping, or remove the callback.")


class BestRound(RoundHook):
    """A round hook: updated after every round's evaluation, loaded into the model at the end of the run."""

    def __init__(self, args) -> None:
        self.metric = best_metric_key(args.metric_for_best_model)
        self.greater = bool(greater_is_better(self.metric, args)) if self.metric is not None else True
        self.keep = bool(args.load_best_model_at_end)
        self.params: Optional[Dict[str, torch.Tensor]] = None
        self.buffers: Optional[Dict[str, torch.Tensor]] = None

    def after_round(self, trainer, run, entry: dict) -> bool:
        """After the round's evaluations (the global one and the personalised one: a ``personal_eval_*`` metric is
        there too); round 0 (``eval_on_start``) is not a candidate, as in Trainer."""
        if entry["round"] > 0 and self.evaluated(entry):
            plan = trainer.plan  # as evaluated: the personal parts too
            self.record(trainer.state, entry, plan.params, {**plan.buffers, **plan.personal})
        return False

    def evaluated(self, entry: dict) -> bool:
        """Whether the evaluation that returns the metric ran this round (the global one, or the personalised)."""
        family = "personal_eval_" if self.metric is not None and is_personal(self.metric) else "eval_"
        return any(key.startswith(family) for key in entry)

    def on_train_end(self, trainer, run) -> None:
        plan = trainer.plan
        trainer.loaded_best_round = self.load_at_end(trainer.state, plan.params, {**plan.buffers, **plan.personal})
        if trainer.loaded_best_round is not None:  # the saved model and its card are that round's
            logger.info("loaded the best round's model (round %d, %s=%s)", trainer.state.best_global_step,
                        self.metric, trainer.state.best_metric)

    def record(self, state, metrics: dict, params, buffers) -> bool:
        """Record ``metrics`` of the round ``state.global_step``; True if it is the new best."""
        if self.metric is None:
            return False
        if self.metric not in metrics:
            raise KeyError(f"`metric_for_best_model` is {self.metric!r}, which the evaluation did not return "
                           f"(it returned {sorted(metrics)}): set metric_for_best_model to one of them.")
        value = metrics[self.metric]
        better = np.greater if self.greater else np.less
        if state.best_metric is None:  # as Trainer starts: a NaN is never better, so never the best
            state.best_metric = float("-inf") if self.greater else float("inf")
        if not better(value, state.best_metric):
            return False
        state.best_metric, state.best_global_step = value, state.global_step
        if self.keep:
            self.params, self.buffers = snapshot(params), snapshot(buffers)
        return True

    def to_checkpoint(self, state) -> Tuple[dict, Dict[str, TensorDict]]:
        """The best round as a checkpoint holds it: TrainerState's ``best_*`` fields (meta) and the kept tensors."""
        groups = {"best_params": self.params, "best_buffers": self.buffers} if self.params is not None else {}
        return {name: getattr(state, name) for name in STATE_FIELDS}, groups

    def from_checkpoint(self, state, meta: dict, groups: Dict[str, TensorDict]) -> None:
        """Back from :meth:`to_checkpoint` (a checkpoint written before it existed has no best round)."""
        for name in STATE_FIELDS:
            setattr(state, name, meta.get(name))
        if self.keep and "best_params" in groups:
            self.params, self.buffers = groups["best_params"], groups.get("best_buffers", {})

    def load_at_end(self, state, params, buffers) -> Optional[int]:
        """Load the best round's global model into the resident model; returns that round (None if nothing to load)."""
        if not self.keep or self.params is None:
            return None
        load_into(params, self.params)
        load_into(buffers, self.buffers)
        return state.best_global_step
