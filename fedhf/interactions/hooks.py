"""The round hooks the matrix declares as features (docs/round_hooks.md): one that changes nothing, one that
zeroes every client's model change (what the server then applies must be nothing), and the documented example's
update-norm metric (examples/round_hook_update_norms.py), whose logged values must not depend on the processes."""

from __future__ import annotations

import statistics
from typing import Dict

import torch

from ..trainer.hooks.base import ClientMessages, RoundHook
from ..trainer.hooks.process_totals import gather_over_processes, sum_over_shards


class Identity(RoundHook):
    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        return sent


class ZeroChange(RoundHook):
    """Sends a zero model change for every client: the global model must stay where it started."""

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        for key, tensor in sent.own.tensors.items():
            if key.startswith("dx."):
                tensor.zero_()
        return sent


class UpdateNorms(RoundHook):
    """The example's metric: the median and largest client update norm of a round, over every process's clients
    and every shard's rows (fedhf.sum_over_shards, fedhf.gather_over_processes), as the example computes it."""

    def __init__(self) -> None:
        self.norms: Dict[int, float] = {}

    def before_round(self, trainer, run) -> None:
        self.norms = {}

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        change = [t.double().pow(2).sum() for k, t in sent.own.tensors.items() if k.startswith("dx.")]
        self.norms[ctx.client_id] = float(sum_over_shards(trainer, torch.stack(change).sum()).sqrt())
        return sent

    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        norms = list(gather_over_processes(trainer, self.norms).values())  # every process calls it
        if norms:
            entry.update({"update_norm_median": statistics.median(norms), "update_norm_max": max(norms)})


HOOKS = {"identity": Identity, "zero_change": ZeroChange, "update_norms": UpdateNorms}
