"""Local Muon: PyTorch's ``torch.optim.Muon`` for matrix parameters, AdamW for the rest.

Muon (Jordan et al., 2024, github.com/KellerJordan/Muon) orthogonalises the momentum of a weight matrix with a
quintic Newton-Schulz iteration, so every update has roughly equal singular values; the FedMuon (Liu et al.,
2025) and FedPAC papers use it as the local optimizer of "Local Muon" (ALGORITHMS.md 1.3, 2.1).

Routing (``routing``):
* ``"ndim>=2"`` (default, the papers' code): every 2-D trainable tensor -- LoRA A and B as separate matrices,
  classifier heads, embeddings -- goes to Muon.
* ``"hidden_only"`` (Keller Jordan's README): 2-D tensors except embeddings and output heads.
Tensors that are not 2-D go to AdamW. Deviation, said here on purpose: the papers' code also flattens conv
filters (4-D) to (out, in*kh*kw) for Muon; ``torch.optim.Muon`` accepts only 2-D parameters, so conv filters
stay on AdamW until fedhf has its own Muon update.

Cost: five Newton-Schulz iterations on an m x n matrix (m <= n) are ~20 m^2 n flops per step, against 6 m n B
for the matrix's forward+backward over B tokens. On LoRA factors (m = r) that is nothing; on full weights at
fine-tuning batches it is more than the model (benchmarks/optimizer_cost.py: 196 vs 58 GFLOP at ~910 tokens),
and an embedding routed here pays it for a layer whose forward is a lookup -- ``hidden_only`` avoids that.

Learning rates follow the FedMuon code: AdamW runs at ``lr`` (the round's scheduled learning rate) and Muon at
``lr * muon_lr_mult``, so the cosine schedule over rounds moves both together.
"""

from __future__ import annotations

from typing import Iterable, List, Mapping, Tuple, Union

import torch

from .base import FederatedOptimizer, TensorDict, split_theta_key, theta_key

ROUTINGS = ("ndim>=2", "hidden_only")
#: Name fragments of embeddings and output heads, which "hidden_only" keeps off Muon.
_NOT_HIDDEN = ("embed", "classifier", "lm_head", "score", "pooler", "head")


def route_to_muon(name: str, param: torch.Tensor, routing: str) -> bool:
    if param.ndim != 2:
        return False
    return routing == "ndim>=2" or not any(fragment in name.lower() for fragment in _NOT_HIDDEN)


class MuonAdamW(FederatedOptimizer):
    """Muon on the routed matrices plus AdamW on everything else, stepped together.

    ``params``: ``named_parameters()`` pairs (needed for ``hidden_only``) or plain tensors (routed by shape).
    Theta = the Muon momentum buffers (``"momentum_buffer:<name>"``), what FedMuon and FedPAC_Muon average; the
    AdamW state of the other tensors is not Theta and restarts every round (ALGORITHMS.md 2.8, 2.9a).
    """

    theta_keys = ("momentum_buffer",)

    def __init__(self, params: Iterable[Union[torch.Tensor, Tuple[str, torch.Tensor]]], lr: float = 3e-4,
                 muon_lr_mult: float = 100.0, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.01, betas: Tuple[float, float] = (0.9, 0.95), eps: float = 1e-10,
                 ns_steps: int = 5, adjust_lr_fn: Union[str, None] = None, routing: str = "ndim>=2") -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"`routing` must be one of {ROUTINGS}, got {routing!r}.")
        named = [(item if isinstance(item, tuple) else (f"param{i}", item)) for i, item in enumerate(params)]
        matrices: List[torch.Tensor] = [p for n, p in named if route_to_muon(n, p, routing)]
        others: List[torch.Tensor] = [p for n, p in named if not route_to_muon(n, p, routing)]
        self.muon_lr_mult = muon_lr_mult
        self.muon = torch.optim.Muon(matrices, lr=lr * muon_lr_mult, momentum=momentum, nesterov=nesterov,
                                     weight_decay=weight_decay, ns_steps=ns_steps,
                                     adjust_lr_fn=adjust_lr_fn) if matrices else None
        self.adamw = torch.optim.AdamW(others, lr=lr, betas=tuple(betas), eps=eps,
                                       weight_decay=weight_decay) if others else None
        super().__init__(named, {"lr": lr})

    def export_theta(self) -> TensorDict:
        if self.muon is None:
            return {}
        return {theta_key("momentum_buffer", self.param_names[p]): state["momentum_buffer"].detach().float().clone()
                for p, state in self.muon.state.items() if "momentum_buffer" in state}

    def import_theta(self, theta: Mapping[str, torch.Tensor]) -> None:
        matrices = {self.param_names[p]: p for p in (self.muon.param_groups[0]["params"] if self.muon else [])}
        for key, value in theta.items():
            state_key, name = split_theta_key(key)
            if state_key != "momentum_buffer" or name not in matrices:
                raise KeyError(f"MuonAdamW has no Theta entry {key!r}")
            p = matrices[name]
            # torch.optim.Muon creates its buffer only when absent, so a warm-started one is kept.
            self.muon.state[p]["momentum_buffer"] = value.detach().to(device=p.device, dtype=p.dtype).clone()

    @property
    def inner(self) -> List[torch.optim.Optimizer]:
        return [o for o in (self.muon, self.adamw) if o is not None]

    def update(self) -> None:
        for optimizer in self.inner:
            optimizer.step()

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict() if self.muon else None,
                "adamw": self.adamw.state_dict() if self.adamw else None}

    def load_state_dict(self, state_dict: dict) -> None:
        for key, optimizer in (("muon", self.muon), ("adamw", self.adamw)):
            if optimizer is not None:
                optimizer.load_state_dict(state_dict[key])
