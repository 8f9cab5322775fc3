"""Stop a run that trains nothing: every client excluded for ``max_excluded_rounds`` rounds in a row.

A client is excluded when its loss or update is non-finite or its update norm exceeds ``max_update_norm``
(fedhf/trainer/runners/client_round.py, :func:`faulty`). One such round leaves the global model unchanged and is logged; many in a row mean
the run cannot make progress, and finishing "successfully" would hide it.
"""

from __future__ import annotations

from typing import Optional

from .base import RoundHook


class AllExcludedError(RuntimeError):
    """Every sampled client was excluded for too many consecutive rounds."""


def likely_cause(learning_rate: float, max_update_norm: Optional[float]) -> str:
    bound = "" if max_update_norm is None else f"or raise `max_update_norm` (now {max_update_norm}), "
    return (f"the local `learning_rate` ({learning_rate:g}) is probably too large (losses turn NaN/Inf): lower it, "
            f"{bound}or check the data for NaN/Inf values")


class ExclusionGuard:
    """Counts consecutive rounds with no surviving client; raises after ``limit`` of them (0 = never)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.streak = limit, 0

    def after_round(self, entry: dict, learning_rate: float, max_update_norm: Optional[float]) -> None:
        # clients trained and every one was excluded; a round no client trained in (an empty Poisson sample, every
        # client offline or late) says nothing about the learning rate and neither counts nor breaks the streak
        if entry["participants"] > 0:
            self.streak = 0
        elif entry["excluded_clients"] > 0:
            self.streak += 1
        if self.limit and self.streak >= self.limit:
            raise AllExcludedError(
                f"Every client was excluded in {self.streak} consecutive rounds (up to round {entry['round']}; "
                f"`max_excluded_rounds`={self.limit}), so the global model no longer changes: "
                + likely_cause(learning_rate, max_update_norm) + ".")


class ExclusionStop(RoundHook):
    """The guard as a round hook: it sees each round's log as soon as the server update is done. Its streak goes
    into the round checkpoint, so a resumed run stops where the uninterrupted one does."""

    def __init__(self, limit: int) -> None:
        self.guard = ExclusionGuard(limit)

    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        self.guard.after_round(entry, trainer.algorithm.local_optimizer.lr, trainer.args.max_update_norm)

    def checkpoint_state(self, trainer, run):
        return {"excluded_streak": self.guard.streak}, {}

    def restore_state(self, trainer, run, meta: dict, groups) -> None:
        self.guard.streak = int(meta.get("excluded_streak", 0))  # a checkpoint written before it was kept: 0
