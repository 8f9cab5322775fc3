"""What a round hook saw on its own process, totalled as one process would have seen it.

Which process runs ``on_client_message``, and what it sees:

* clients spread over processes (``torchrun`` / ``accelerate launch``; client id modulo the number of processes):
  the process that trained the client, with the client's whole messages; the other processes never see it;
* ``client_parallel``: every process trains every client (each micro-batch split in rows) and holds the client's
  whole messages, the same on every process;
* FSDP (``fsdp``): every process trains every client and holds its own rows of each tensor (its shards).

So a per-client statistic takes two totals: over a client's shards (:func:`sum_over_shards`, inside
``on_client_message``: a squared norm summed over the row shards is the whole tensor's) and over the processes'
clients (:func:`gather_over_processes`, at an event every process reaches, e.g. ``after_aggregate``). On one process
both return their argument.
"""

from __future__ import annotations

from typing import Dict

import torch


def sum_over_shards(trainer, partial) -> torch.Tensor:
    """``partial``, a sum over one client's tensors as this process holds them (a squared norm, a count), as the
    whole tensors give it (float64): under FSDP summed over the processes' shards (one all-reduce; every process
    runs ``on_client_message`` for every client there, in the same order), else as it is."""
    return trainer.shards.total(torch.as_tensor(partial, dtype=torch.float64))


def gather_over_processes(trainer, per_client: Dict[int, float]) -> Dict[int, float]:
    """Per-client values (client id -> a picklable value) from every process, in client order: gathered when the
    clients are spread over processes (one all-gather; every process must call it at the same event), as they are
    under ``client_parallel``, FSDP or one process, where every process saw every client."""
    world = trainer.world
    if world.size == 1 or world.client_parallel or world.sharded:
        return dict(sorted(per_client.items()))
    parts = [None] * world.size
    torch.distributed.all_gather_object(parts, dict(per_client))
    return dict(sorted((client, value) for part in parts for client, value in part.items()))
