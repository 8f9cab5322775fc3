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
gradient of the union's mean, as :meth:`fedhf.trainer.runners.client_round.ClientRound.accumulate` computes it on one process; the result
differs from one process only by float rounding (the base runs on smaller batches, the sum is a reduction).
Curvature passes of the optimizer (Sophia's probe, FOOF's statistics) run on the full batches on every process,
identically (same seeds: the client's stream, which every process seeds alike). The shards' forwards draw from
their own stream instead, one per process (:class:`ForwardStream`): dropout, NEFTune's noise and any other draw
of a forward differ between row shards, as they differ between the rows of one process's batch, and the shared
stream stays equal on every process whatever the shards' sizes (a draw's length follows its shard's).

Under FSDP every process must run every micro-batch's forward and backward (its all-gathers and reduce-scatters
pair them up): a process whose shard is empty or has no label token (a client's short last batch of fewer rows
than processes) runs a stand-in instead, a labelled row of the micro-batch weighted 0, which adds nothing to the
gradient or the loss. The union's weighting is untouched, so the result is still one process's.

Counted once: every process ends the round with the same client messages, so only process 0 adds them to the
round's sums (the others add into a sums object that is dropped); the round's all-reduce then carries each client
exactly once (were every process to add them, each client would count world-size times).

Refused before any work (fedhf/trainer/config/combinations/): ``batched_clients > 1`` (its stacked copies split the
rows by client already), models with averaged buffers (BatchNorm statistics of a shard are not those of the
batch), a ``compute_loss_func`` (the shard weighting needs the model's own mean loss). With ``fsdp`` the model is
also sharded over the processes (fedhf/runtime/sharded.py): FSDP's reduce-scatter then sums the gradients into each
process's shards, in place of :func:`all_reduce_gradients`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import Dict, List, Optional

import torch

from ...runtime.model_outputs import loss_items


def shard(batch: Dict[str, torch.Tensor], rank: int, size: int) -> Dict[str, torch.Tensor]:
    """Rows ``rank`` of ``size`` contiguous row shards of a batch (``torch.tensor_split``: sizes differ by <= 1)."""
    return {k: torch.tensor_split(v, size)[rank] if torch.is_tensor(v) and v.dim() > 0 else v
            for k, v in batch.items()}


class ForwardStream:
    """This process's random stream for the forwards of its row shards, kept apart from the client's shared stream
    (the global generator, which curvature draws read and which must stay equal on every process): :meth:`drawing`
    swaps it in around a forward and backward and keeps where it got to. ``device``: the model's (a CUDA model
    draws its dropout from that device's generator)."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        with torch.random.fork_rng(devices=self.devices):
            torch.manual_seed(seed)
            self.state = self._capture()

    def _capture(self):
        return torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in self.devices]

    @contextmanager
    def drawing(self):
        with torch.random.fork_rng(devices=self.devices):  # the shared stream is as it was afterwards
            cpu, devices = self.state
            torch.set_rng_state(cpu)
            for d, state in zip(self.devices, devices):
                torch.cuda.set_rng_state(state, d)
            yield
            self.state = self._capture()


def labelled_row(batch: Dict[str, torch.Tensor], shifted: bool) -> Dict[str, torch.Tensor]:
    """A one-row batch of the first row with an item (a label token, after a causal LM's shift; any row when
    labels are per row): a forward whose loss is finite, for a process whose own shard has nothing to run."""
    labels, row = batch.get("labels"), 0
    if torch.is_tensor(labels) and labels.ndim >= 2:
        kept = (labels[..., 1:] if shifted else labels).ne(-100).reshape(labels.shape[0], -1).any(dim=1)
        row = int(kept.nonzero()[0])
    return {k: v[row:row + 1] if torch.is_tensor(v) and v.dim() > 0 else v for k, v in batch.items()}


def accumulate_shards(trainer, micro_batches: List[dict], reduce=None,
                      stream: Optional[ForwardStream] = None) -> float:
    """This process's shards of the step's micro-batches, weighted by their share of the union's items, then
    the gradients and loss summed over processes (``reduce(params, loss)``: by default one all-reduce of the
    gradients; under FSDP its own reduce-scatter, fedhf/runtime/sharded.py). Returns the union's loss (the same
    on every process). ``stream``: this process's forward stream (:class:`ForwardStream`)."""
    world, shifted = trainer.world, trainer._loss_shifts_labels
    total = sum(loss_items(batch, shifted) for batch in micro_batches)
    loss = 0.0
    for batch in micro_batches:
        if loss_items(batch, shifted) == 0:  # nothing to learn in the whole micro-batch: every process skips it,
            continue  # as one process does (its mean would be NaN)
        part = shard(batch, world.rank, world.size)
        n = loss_items(part, shifted)
        divisor = total / n if n else math.inf  # the divisor inf weights a loss 0 (its gradient too)
        if n == 0:  # an empty shard, or nothing to learn from: its mean would be NaN
            if not trainer.shards.active:
                continue
            part = labelled_row(batch, shifted)  # FSDP's collectives need every process in every forward
        trainer.current_gradient_accumulation_steps = divisor
        with stream.drawing() if stream is not None else nullcontext():
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
