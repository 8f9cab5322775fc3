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
the lr adjustment are torch's (the iteration its own function, the rest fedhf's one Muon step,
fedhf/optim/muon_step.py, with this gathering orthogonaliser), so the step is the one-process step.
"""

from __future__ import annotations

import torch
from torch.optim._muon import _zeropower_via_newtonschulz

from .muon_step import muon_step


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
            def orthogonalise(updates, group=group):  # the whole matrix, gathered; each process keeps its rows
                return [_zeropower_via_newtonschulz(self.sharded.gather(u), group["ns_coefficients"],
                                                    group["ns_steps"], group["eps"]) for u in updates]

            for p in group["params"]:  # one matrix gathered at a time
                if p.grad is not None:
                    muon_step(self.state, [p], group, orthogonalise, local=self.sharded.local_part)
        return loss
