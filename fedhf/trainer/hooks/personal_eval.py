"""Personalised evaluation (``personalized_eval=True``): each client's own model, the global shared tensors plus
that client's personal ones from the client store (for an all-shared run: the global model), evaluated on that
client's held-out rows (``client_eval_fraction``, :mod:`fedhf.data.holdout`), at the rounds the global model is
evaluated. The personalised-FL papers report it this way (e.g. Ditto, Li et al., ICML 2021, arXiv:2012.04221;
pFedMe, T. Dinh et al., NeurIPS 2020): the mean over clients, and the worst client for fairness.

Logged beside the global ``eval_*`` keys, for the loss and every metric of ``compute_metrics`` (m):

* ``personal_eval_<m>_mean``: the mean over evaluated clients (each client counts once, whatever its row count);
* ``personal_eval_<m>_worst``: the worst client, in the metric's direction (fedhf/metrics/direction.py: the
  run's ``greater_is_better`` for ``metric_for_best_model``, else the table of known names: the highest loss, mse,
  wer, ..., the lowest accuracy, F1, ...); not logged for a name of unknown direction (a warning says how to
  declare it), rather than guessed;
* ``personal_eval_<m>_std``: the population standard deviation over clients (the spread);
* ``personal_eval_clients`` (evaluated) and ``personal_eval_skipped`` (clients with no held-out rows).

Every client is evaluated, sampled this round or not (a client that never trained has the initial personal
tensors). It changes nothing of training: the resident model gets the global model back after every client (the
clients' mean personal tensors, as after a round) and the random number generators' states are restored, so the trained
model is bit-identical with and without it (tests/trainer/hooks/test_personal_eval.py). A round hook of
:class:`fedhf.trainer.FederatedTrainer`.
"""

from __future__ import annotations

import random
from typing import Callable, Dict, Optional, Sequence

import datasets
import numpy as np
import torch
from torch.utils.data import Subset
from transformers.utils import logging

from ...core.params import load_into
from ...metrics.direction import greater_is_better, known_direction
from .base import RoundHook
from ..config.settings import should_evaluate

PREFIX = "personal_eval"
_NOT_METRICS = ("runtime", "samples_per_second", "steps_per_second", "model_preparation_time")
logger = logging.get_logger(__name__)


def summarise(per_client: Sequence[Dict[str, float]], skipped: int,
              greater: Callable[[str], Optional[bool]] = known_direction) -> Dict[str, float]:
    """Mean, worst and std over clients of every metric the clients share (names without the ``eval_`` prefix);
    ``greater(m)``: whether higher is better for ``m`` (None: unknown, no ``_worst``)."""
    summary: Dict[str, float] = {f"{PREFIX}_clients": len(per_client), f"{PREFIX}_skipped": skipped}
    if not per_client:
        return summary
    names = [m for m in per_client[0] if all(m in c for c in per_client)]
    for m in names:
        values = np.array([c[m] for c in per_client], dtype=np.float64)
        summary.update({f"{PREFIX}_{m}_mean": float(values.mean()), f"{PREFIX}_{m}_std": float(values.std())})
        direction = greater(m)
        if direction is None:
            logger.warning_once(f"personal_eval_{m}_worst is not logged: the direction of {m!r} is unknown; name it "
                                f"as metric_for_best_model with greater_is_better to declare it.")
        else:
            summary[f"{PREFIX}_{m}_worst"] = float(values.min() if direction else values.max())
    return summary


class _SavedRandomState:
    """Python, numpy and torch (CPU and accelerator) generator states, put back on exit."""

    def __enter__(self):
        self.states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                       torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
        return self

    def __exit__(self, *exc):
        py, np_state, cpu, cuda = self.states
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        return False


class PersonalEvaluation(RoundHook):
    """A round hook: at the rounds the global model is evaluated (``eval_every_rounds`` / ``eval_steps``, the last
    round, and round 0 with ``eval_on_start``; also without an ``eval_dataset``) it adds the summary to the round's
    entry and logs it to callbacks; ``trainer.personal_eval_per_client`` keeps each client's metrics (client id ->
    metrics) of the latest evaluation. Nothing without ``personalized_eval``."""

    def after_round(self, trainer, run, entry: dict) -> bool:
        rounds_done = entry["round"]
        if not trainer.args.personalized_eval or (rounds_done and not should_evaluate(trainer.args, rounds_done, True)):
            return False
        metrics = personal_evaluation(trainer, run)
        trainer.log(dict(metrics))
        entry.update(metrics)
        return False


def personal_evaluation(trainer, run) -> Dict[str, float]:
    """The summary over clients. With ``lora_client_ranks`` a client's model is the global adapter cut to its rank
    (fedhf/sharing/client_ranks.py), as it trains."""
    plan, partitions = trainer.plan, trainer.client_eval_partitions
    rows_of = {client: rows for client, rows in enumerate(partitions) if len(rows)}
    skipped = len(partitions) - len(rows_of)
    with _SavedRandomState():
        together = trainer.runner.evaluate_clients(rows_of)  # batched clients: C clients per stacked pass
        per_client: Dict[int, Dict[str, float]] = {} if together is None else together
        for client, rows in rows_of.items() if together is None else ():
            plan.load_personal(trainer.client_store, client, run.personal_init)
            plan.begin_client(client)
            try:
                per_client[client] = evaluate_rows(trainer, rows)
            finally:  # the global model again
                plan.load_global_personal_again()
                load_into(plan.params, run.global_params)
    trainer.personal_eval_per_client = per_client
    return summarise(list(per_client.values()), skipped, lambda m: greater_is_better(m, trainer.args))


def evaluate_rows(trainer, rows) -> Dict[str, float]:
    """Trainer's evaluation loop (its batching, autocast and compute_metrics) over some training rows; no
    callbacks' on_evaluate and no log, which are the global evaluation's."""
    output = trainer.evaluation_loop(trainer.get_test_dataloader(held_out_rows(trainer, rows)),
                                     description="Personalised evaluation",
                                     prediction_loss_only=True if trainer.compute_metrics is None else None,
                                     metric_key_prefix="eval")
    return {k[len("eval_"):]: float(v) for k, v in output.metrics.items()
            if not any(k.endswith(n) for n in _NOT_METRICS)}


def held_out_rows(trainer, rows):
    """The rows ``rows`` of the training set (a client's held-out ones)."""
    rows = [int(i) for i in rows]
    data = trainer.train_dataset
    return data.select(rows) if isinstance(data, datasets.Dataset) else Subset(data, rows)
