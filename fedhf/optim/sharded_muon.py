"""Muon over FSDP2 shards: the momentum kept per shard, each matrix gathered only to be orthogonalised.

``torch.optim.Muon``'s step for one matrix W with gradient G (Jordan et al., 2024; torch 2.13's
``_single_tensor_muon``)::

    B <- lerp(B, G, 1 - mu)                       (elementwise: on the shard)
    U <- lerp(G, B, mu) if nesterov else B        (elementwise: on the shard)
    O <- NewtonSchulz5(U)                         (the whole matrix: gathered, one matrix at a time)
    W <- W (1 - lr wd) - lr_adj(shape of W) O     (this rank's rows of O)

as distributed Muon implementations run it over FSDP2 (microsoft/dion's ``muon.py``; Essential AI, "Practical
Efficiency of Muon for Pretraining", 2025): the momentum -- FedMuon's and FedPAC_Muon's Theta -- never leaves its
shard, so Muon's state is divided by the processes like the weights. Every process orthogonalises every matrix (the
same numbers on each: same input, same kernel); spreading the matrices over the processes would save that compute
at the price of a scatter per matrix, which this CPU-tested version does not do. The Newton-Schulz iteration and
the lr adjustment are torch's own functions, so the step is the one-process step.
"""

from __future__ import annotations

import torch
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz


class ShardedMuon(torch.optim.Optimizer):
    """``torch.optim.Muon``'s param groups (its hyper-parameters included) stepped on shards; ``sharded`` gathers and
    splits rows (:class:`fedhf.runtime.sharded.ShardedModel`). The state is torch's (``momentum_buffer`` per
    parameter), so :class:`fedhf.optim.muon.MuonAdamW` exports and imports Theta from it unchanged."""

    def __init__(self, param_groups, sharded) -> None:
        super().__init__([dict(group) for group in param_groups], {})
        self.sharded = sharded

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buffer = state["momentum_buffer"]
                buffer.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buffer, group["momentum"]) if group["nesterov"] else buffer
                whole = self.sharded.gather(update)
                orthogonal = _zeropower_via_newtonschulz(whole, group["ns_coefficients"], group["ns_steps"],
                                                         group["eps"])
                adjusted_lr = _adjust_lr(group["lr"], group["adjust_lr_fn"], whole.shape)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(self.sharded.local_part(orthogonal), alpha=-adjusted_lr)
        return loss
