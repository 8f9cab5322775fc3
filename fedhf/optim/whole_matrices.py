"""A local optimizer that needs whole matrices, run over FSDP2 shards (fedhf/runtime/sharded.py).

:func:`over_shards` picks how: an elementwise optimizer steps the shards as they are; Muon (its default form,
``torch.optim.Muon``) keeps its momentum per shard and gathers only the matrix it orthogonalises
(:class:`fedhf.optim.sharded_muon.ShardedMuon`); any other steps gathered whole copies (:class:`WholeMatrices`).

Muon orthogonalises each matrix's momentum with Newton-Schulz, and SOAP rotates each gradient into the eigenbases
of its factors L = G G^T, R = G^T G: neither is a function of a shard's rows alone. Distributed Muon implementations
gather each matrix for its orthogonalisation and keep their shard of the result (microsoft/dion's ``muon.py``,
Ahn et al., 2025; Essential AI's "Practical Efficiency of Muon for Pretraining", 2025). :class:`WholeMatrices`
does that for any optimizer: at each step every parameter and its gradient are gathered, one matrix at a time, the
optimizer steps the whole copies (the same numbers on every process: same inputs, same kernels), and each process
writes its rows back into its shard. The step is therefore the one-process step.

What it costs: the optimizer's state is whole on every process (its memory is not divided by the processes; the
weights, gradients and everything else of the round are), plus one whole copy of the trained tensors. Theta leaves
the optimizer as this process's rows of each Theta tensor (dim 0, FSDP's layout), so the state syncs, sums and
per-client stores hold shards like every other tensor of the round; an imported Theta is gathered back whole.
"""

from __future__ import annotations

from typing import Callable, Dict, Mapping

import torch

from .amsgrad import AMSGradNoBias
from .base import OptimizerHooks, TensorDict

#: Optimizers whose step is elementwise (each entry of a parameter from the same entries of its gradient and
#: state): they step FSDP's shards as they are. Any other is stepped on whole matrices.
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, AMSGradNoBias)


def is_elementwise(optimizer_class: type) -> bool:
    return issubclass(optimizer_class, ELEMENTWISE)


def over_shards(local_optimizer, views: Dict[str, torch.Tensor], lr: float, sharded) -> OptimizerHooks:
    """A client's optimizer (:class:`fedhf.optim.LocalOptimizer`) over this process's shards ``views``; with a model
    that is not sharded (``sharded.active`` False) the optimizer over the parameters themselves."""
    from .muon import MuonAdamW
    from .sharded_muon import ShardedMuon

    if not sharded.active or is_elementwise(local_optimizer.cls):
        return local_optimizer.build(views, lr)
    if issubclass(local_optimizer.cls, MuonAdamW):
        optimizer = local_optimizer.build(views, lr)
        if type(optimizer.muon) is torch.optim.Muon:  # the default form: the momentum stays on the shards
            optimizer.muon = ShardedMuon(optimizer.muon.param_groups, sharded)
            return optimizer
        if optimizer.muon is None:  # no matrix routed to Muon: AdamW alone, elementwise
            return optimizer
    return WholeMatrices(lambda whole: local_optimizer.build(whole, lr), views, sharded)


class WholeMatrices(OptimizerHooks):
    """``build(whole_params) -> OptimizerHooks`` stepped on gathered copies of ``views`` (this rank's shards).

    ``sharded``: what gathers and splits rows (:class:`fedhf.runtime.sharded.ShardedModel`: ``gather``,
    ``local_part``)."""

    def __init__(self, build: Callable[[Dict[str, torch.Tensor]], OptimizerHooks], views: Dict[str, torch.Tensor],
                 sharded) -> None:
        self.views, self.sharded = views, sharded
        with torch.no_grad():
            self.whole = {name: sharded.gather(view).clone() for name, view in views.items()}
        self.inner = build(self.whole)
        self.imports_theta = self.inner.imports_theta
        self.theta_kinds = self.inner.theta_kinds

    def step(self, closure=None):
        with torch.no_grad():
            for name, view in self.views.items():
                whole = self.whole[name]
                whole.copy_(self.sharded.gather(view))  # a correction may have moved the shard since the last step
                whole.grad = None if view.grad is None else self.sharded.gather(view.grad)
            loss = self.inner.step(closure)
            for name, view in self.views.items():
                view.copy_(self.sharded.local_part(self.whole[name]))
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for name, view in self.views.items():
            view.grad = None
            self.whole[name].grad = None

    def export_theta(self) -> TensorDict:
        return {key: self.sharded.local_part(value).clone() for key, value in self.inner.export_theta().items()}

    def import_theta(self, theta: Mapping[str, torch.Tensor]) -> None:
        self.inner.import_theta({key: self.sharded.gather(value) for key, value in sorted(theta.items())})

    def theta_kind(self, state_key: str) -> str:
        return self.inner.theta_kind(state_key)

    def theta_structure(self, theta: Mapping[str, torch.Tensor]) -> Dict[str, str]:
        return self.inner.theta_structure(theta)

    def attach(self, access) -> None:
        self.inner.attach(access)

    def end_round(self) -> None:
        self.inner.end_round()
