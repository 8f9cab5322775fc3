"""Client-parallel training (``client_parallel=True``): all processes train each sampled client together (the
runner: :class:`fedhf.trainer.runners.base.ClientParallelClients`).

The default spreads clients over processes (client id modulo the number of processes) and sums their messages
with one all-reduce per round. For a client too big or too slow for one device, ``client_parallel`` turns that
around, as DistributedDataParallel does for one model (Li et al., 2020, "PyTorch Distributed", VLDB): every
process trains every sampled client, and each of the client's micro-batches is split into P contiguous row shards,
shard p on process p. The gradients are summed over processes (one all-reduce per optimizer step) before clipping,
the correction and the optimizer, so every process holds the same client model, optimizer state and message.

Equal to one process: each shard's loss is the model's own mean over its shard, weighted by the shard's share of
the items (label tokens, or rows) of the step's whole union of micro-batches, which every process knows because
every process reads the client's full batches from the same seeded stream. The summed gradient is then the
gradient of the union's mean, as :meth:`fedhf.trainer.runners.local_steps.LocalSteps.accumulate` computes it on one process; the result
differs from one process only by float rounding (the base runs on smaller batches, the sum is a reduction).
Curvature passes of the optimizer (Sophia's probe, FOOF's statistics) run on the full batches on every process,
identically (same seeds).

Counted once: every process ends the round with the same client messages, so only process 0 adds them to the
round's sums (the others add into a sums object that is dropped); the round's all-reduce then carries each client
exactly once (were every process to add them, each client would count world-size times).

Refused before any work (fedhf/trainer/config/combinations.py): ``batched_clients > 1`` (its stacked copies split the
rows by client already), models with averaged buffers (BatchNorm statistics of a shard are not those of the
batch), a ``compute_loss_func`` (the shard weighting needs the model's own mean loss). With ``fsdp`` the model is
also sharded over the processes (fedhf/runtime/sharded.py): FSDP's reduce-scatter then sums the gradients into each
process's shards, in place of :func:`all_reduce_gradients`.
"""

from __future__ import annotations

from typing import Dict, List

import torch

from ...runtime.model_outputs import loss_items


def shard(batch: Dict[str, torch.Tensor], rank: int, size: int) -> Dict[str, torch.Tensor]:
    """Rows ``rank`` of ``size`` contiguous row shards of a batch (``torch.tensor_split``: sizes differ by <= 1)."""
    return {k: torch.tensor_split(v, size)[rank] if torch.is_tensor(v) and v.dim() > 0 else v
            for k, v in batch.items()}


def accumulate_shards(trainer, micro_batches: List[dict], reduce=None) -> float:
    """This process's shards of the step's micro-batches, weighted by their share of the union's items, then
    the gradients and loss summed over processes (``reduce(params, loss)``: by default one all-reduce of the
    gradients; under FSDP its own reduce-scatter, fedhf/runtime/sharded.py). Returns the union's loss (the same
    on every process)."""
    world, shifted = trainer.world, trainer._loss_shifts_labels
    total = sum(loss_items(batch, shifted) for batch in micro_batches)
    loss = 0.0
    for batch in micro_batches:
        part = shard(batch, world.rank, world.size)
        n = loss_items(part, shifted)
        if n == 0:  # an empty shard, or nothing to learn from: its mean would be NaN
            if trainer.shards.active:  # FSDP's collectives need every process in every forward and backward
                raise ValueError(f"A row shard of a micro-batch has no {'label token' if shifted else 'row'} to "
                                 "learn from on this process, and FSDP needs every process to run every micro-batch: "
                                 "raise per_device_train_batch_size (at least the number of processes) or drop "
                                 "fully masked rows from the data.")
            continue
        trainer.current_gradient_accumulation_steps = total / n
        loss += float(trainer.training_step(trainer.model, part))
    trainer.current_gradient_accumulation_steps = 1
    return (reduce or all_reduce_gradients)(trainer.plan.trained(), loss)


def all_reduce_gradients(params: Dict[str, torch.nn.Parameter], loss: float) -> float:
    """Sum ``.grad`` over processes in one flat buffer (a tensor without a gradient on every process keeps None,
    as on one process: an optimizer skips it); returns the summed loss. The buffer lives on the parameters' device
    (NCCL reduces GPU tensors only)."""
    dist = torch.distributed
    names = sorted(params)
    device = params[names[0]].device
    head = torch.tensor([params[n].grad is not None for n in names] + [loss], dtype=torch.float64, device=device)
    flat = torch.cat([head] + [
        (params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])).double().reshape(-1)
        for n in names])
    dist.all_reduce(flat)
    offset, present = len(names) + 1, flat[:len(names)].tolist()  # one device-to-host copy
    for i, name in enumerate(names):
        p = params[name]
        if present[i] > 0:
            p.grad = flat[offset:offset + p.numel()].view_as(p).to(p.dtype).clone()
        offset += p.numel()
    return float(flat[len(names)])
