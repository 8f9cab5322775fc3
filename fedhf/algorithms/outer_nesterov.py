"""DiLoCo and MuLoCo: local adaptive steps, each client's inner optimizer kept whole from one round to its next
(``state_sync="persist_local"`` with ``keep="state"``: moments and step counters), no correction, and an outer
Nesterov SGD step on the mean client change (:class:`fedhf.server.ServerMomentum` with ``nesterov=True``;
docs/algorithms.md 2.16). The reference keeps each worker's inner state: torchft's DiLoCo never touches the inner
optimizer between outer steps, and DES-LOC (Iacob et al., 2025) describes the family as keeping momenta local.
``state_sync="reset"`` gives the earlier variant (a fresh inner optimizer every round).

Both come from data-centre pre-training, where the "clients" are workers on shards of one corpus; here they run on
fedhf's non-IID clients unchanged. "Sends" as in second_order.py: Delta up, x down (1 | 1); the outer momentum
stays on the server.
"""

from __future__ import annotations

from .compose import ALGORITHMS, Algorithm
from ..optim import LocalOptimizer
from ..server import Mean, ServerMomentum, ServerRule
from ..sync import PersistLocal


def _outer_nesterov(server_lr: float, server_momentum: float) -> ServerRule:
    return ServerRule(Mean(), [ServerMomentum(server_lr, server_momentum, nesterov=True)])


@ALGORITHMS.register("diloco")
def diloco(lr: float = 4e-4, weight_decay: float = 0.1, betas=(0.9, 0.999), eps: float = 1e-8,
           server_lr: float = 0.7, server_momentum: float = 0.9) -> Algorithm:
    """DiLoCo (Douillard et al., 2023, "DiLoCo: Distributed Low-Communication Training of Language Models", Alg. 1):
    AdamW inside, its state kept per client across rounds, outer Nesterov SGD with lr 0.7 and momentum 0.9 (the paper's outer optimizer).
    Inner lr 4e-4 and wd 0.1 are the paper's pre-training values as we recall them (not re-checked against its
    table); AdamW's betas are torch's defaults. Sends 1 | 1."""
    opt = LocalOptimizer("adamw", {"lr": lr, "weight_decay": weight_decay, "betas": tuple(betas), "eps": eps})
    return Algorithm("diloco", opt, server_rule=_outer_nesterov(server_lr, server_momentum),
                     state_sync=PersistLocal(keep="state"))


@ALGORITHMS.register("muloco")
def muloco(lr: float = 4.4e-4, muon_lr_mult: float = 100.0, momentum: float = 0.95, weight_decay: float = 0.00125,
           routing: str = "hidden_only", server_lr: float = 0.9, server_momentum: float = 0.8) -> Algorithm:
    """MuLoCo (Therien et al., 2025, "MuLoCo: Muon is a Practical Inner Optimizer for DiLoCo", arXiv 2505.23725):
    DiLoCo with Muon inside -- on hidden matrices only (``routing="hidden_only"``; embeddings, heads and 1-D tensors
    on AdamW), its whole state kept per client across rounds -- and the same outer Nesterov SGD. Sends 1 | 1.

    Defaults: Muon lr = lr * muon_lr_mult = 0.044, wd 0.00125, outer lr 0.9, outer momentum 0.8, as the
    configuration was reported to us. Checked: the paper's first version runs K = 8 workers and H = 30 inner steps
    (its Figure 1), and the authors' MuLoCo-1 repository (github.com/bentherien/muloco-1) gives, for one worker
    (K = 1), Muon lr 0.016-0.063 across scales and wd 5e-4-5e-3 -- 0.044 and 0.00125 lie inside -- with outer lr 0.7
    and momentum 0.6 (DiLoCo K = 1: momentum 0.8). Outer lr 0.9 and momentum 0.8 for K > 1 we could not find in the
    text available to us: unverified. Muon momentum 0.95 is Keller Jordan's default."""
    opt = LocalOptimizer("muon", {"lr": lr, "muon_lr_mult": muon_lr_mult, "momentum": momentum,
                                  "weight_decay": weight_decay, "routing": routing})
    return Algorithm("muloco", opt, server_rule=_outer_nesterov(server_lr, server_momentum),
                     state_sync=PersistLocal(keep="state"))
