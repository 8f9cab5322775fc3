"""One Muon step, whatever orthogonalises it: momentum, Nesterov, lr scaling, weight decay and the update, written
once for fedhf's three Muon forms -- :class:`fedhf.optim.muon_exact.ExactMuon` (per matrix, quintic Newton-Schulz or
the exact polar factor), :class:`fedhf.optim.muon_batched.BatchedMuon` (a group's matrices in batched calls, pooled
across a batched chunk's clients by fedhf/optim/newton_schulz_pool.py) and :class:`fedhf.optim.sharded_muon.ShardedMuon`
(per FSDP2 shard, each matrix gathered to be orthogonalised). What differs between them is only the orthogonaliser,
passed in (optax's ``scale_by_muon`` takes its Newton-Schulz the same way).

torch.optim.Muon's math (Jordan et al., 2024; torch 2.13's ``_single_tensor_muon``), per 2-D parameter W with
gradient G and momentum buffer B::

    momentum "ema":  B <- lerp(B, G, 1 - mu) ;  U = lerp(G, B, mu) if nesterov else B
    momentum "sum":  B <- mu B + G           ;  U = G + mu B        if nesterov else B   (FedMuon's Algorithm 1)
    O = orthogonalise(U)
    W <- W (1 - lr wd) ;  W <- W - lr scale(shape of O) O

``scale`` is torch's ``adjust_lr_fn``: "original" (the default) sqrt(max(1, rows / cols)), "match_rms_adamw"
0.2 sqrt(max(rows, cols)). Every operation is per tensor, as torch's single-tensor step, so a matrix's result does not
depend on which other matrices step with it.
"""

from __future__ import annotations

import math
from typing import Callable, Generator, List, Mapping, Sequence

import torch

#: The updates U of a step's matrices -> their orthogonalised O, one for one (O may be a whole matrix of a shard).
Orthogonaliser = Callable[[List[torch.Tensor]], List[torch.Tensor]]
#: A Muon step written as parts: yields the updates to orthogonalise, is sent their orthogonalised matrices back.
MuonParts = Generator[List[torch.Tensor], List[torch.Tensor], None]


def lr_scale(shape: Sequence[int], adjust_lr_fn=None) -> float:
    """torch.optim.Muon's lr adjustment of a (rows, cols) matrix (its ``_adjust_lr`` over lr)."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1, rows / cols))


def _whole(ortho: torch.Tensor) -> torch.Tensor:
    return ortho


def muon_parts(state: Mapping, params: List[torch.Tensor], group: Mapping, momentum_form: str = "ema",
               local: Callable[[torch.Tensor], torch.Tensor] = _whole) -> MuonParts:
    """One Muon step of ``params`` (each with a gradient) under ``group``'s hyper-parameters (lr, momentum,
    nesterov, weight_decay, adjust_lr_fn when present) as parts: yields the updates U, is sent each one's O.
    ``state``: the optimizer's (a ``momentum_buffer`` per parameter, created only when absent, so an imported Theta
    survives the first step). ``local``: the part of a whole O that is the parameter's (a shard's rows); the lr
    scale reads the whole O's shape. Call with gradients off (each half runs where its caller is)."""
    mu = group["momentum"]
    updates = []
    for p in params:
        grad, p_state = p.grad, state[p]
        if "momentum_buffer" not in p_state:
            p_state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        buf = p_state["momentum_buffer"]
        if momentum_form == "ema":
            buf.lerp_(grad, 1 - mu)
            updates.append(grad.lerp(buf, mu) if group["nesterov"] else buf)
        else:
            buf.mul_(mu).add_(grad)
            updates.append(grad.add(buf, alpha=mu) if group["nesterov"] else buf)
    orthos = yield updates
    lr, adjust_lr_fn = group["lr"], group.get("adjust_lr_fn")
    for p, ortho in zip(params, orthos):
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(local(ortho), alpha=-lr * lr_scale(ortho.shape, adjust_lr_fn))


def finish(parts: MuonParts, orthos: List[torch.Tensor]) -> None:
    """The rest of a step begun with ``next(parts)``, given its orthogonalised updates."""
    try:
        parts.send(orthos)
    except StopIteration:
        pass


def muon_step(state: Mapping, params: List[torch.Tensor], group: Mapping, orthogonalise: Orthogonaliser,
              momentum_form: str = "ema", local: Callable[[torch.Tensor], torch.Tensor] = _whole) -> None:
    """:func:`muon_parts` with its updates answered by ``orthogonalise`` at once."""
    parts = muon_parts(state, params, group, momentum_form, local)
    finish(parts, orthogonalise(next(parts)))
