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

from ..core.params import TensorDict, load_into, snapshot
from .hooks import RoundHook

logger = logging.get_logger(__name__)

STATE_FIELDS = ("best_metric", "best_global_step", "best_model_checkpoint")  # TrainerState's, as Trainer keeps them


class BestRound(RoundHook):
    """A round hook: updated after every round's evaluation, loaded into the model at the end of the run."""

    def __init__(self, args) -> None:
        self.metric = args.metric_for_best_model
        if self.metric is not None and not self.metric.startswith("eval_"):
            self.metric = f"eval_{self.metric}"
        self.greater = bool(args.greater_is_better)
        self.keep = bool(args.load_best_model_at_end)
        self.params: Optional[Dict[str, torch.Tensor]] = None
        self.buffers: Optional[Dict[str, torch.Tensor]] = None

    def after_evaluate(self, trainer, run, entry: dict) -> None:
        plan = trainer.plan  # as evaluated: the personal parts too
        self.record(trainer.state, entry, plan.params, {**plan.buffers, **plan.personal})

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
        if state.best_metric is not None and not better(value, state.best_metric):
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
