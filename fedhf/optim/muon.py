"""Local Muon: PyTorch's ``torch.optim.Muon`` for matrix parameters, AdamW for the rest.

Muon (Jordan et al., 2024, github.com/KellerJordan/Muon) orthogonalises the momentum of a weight matrix with a
quintic Newton-Schulz iteration, so every update has roughly equal singular values; the FedMuon (Liu et al.,
2025) and FedPAC papers use it as the local optimizer of "Local Muon" (docs/algorithms.md 1.3, 2.1).

Routing (``routing``):
* ``"ndim>=2"`` (default, the papers' code): every trainable tensor of 2 or more dimensions -- LoRA A and B as
  separate matrices, classifier heads, embeddings, conv filters -- goes to Muon.
* ``"hidden_only"`` (Keller Jordan's README): the same except embeddings and output heads.
1-D tensors (biases, norms) go to AdamW. ``torch.optim.Muon`` takes only 2-D parameters, so a tensor of 3 or
more dimensions (a conv filter (out, in, kh, kw)) reaches it as a 2-D view (out, in*kh*kw) sharing its storage,
its gradient viewed the same way at every step: the papers' flattening (docs/algorithms.md 1.3), with the lr
scaling sqrt(max(1, rows/cols)) of the view. Its momentum (Theta) is exported in the tensor's own shape. A
tensor whose storage cannot be viewed so (not contiguous, e.g. channels_last) goes to AdamW.

Cost: five Newton-Schulz iterations on an m x n matrix (m <= n) are ~20 m^2 n flops per step, against 6 m n B
for the matrix's forward+backward over B tokens. On LoRA factors (m = r) that is nothing; on full weights at
fine-tuning batches it is more than the model (benchmarks/optimizer_cost.py: 196 vs 58 GFLOP at ~910 tokens),
and an embedding routed here pays it for a layer whose forward is a lookup -- ``hidden_only`` avoids that.

Learning rates follow the FedMuon code: AdamW runs at ``lr`` (the round's scheduled learning rate) and Muon at
``lr * muon_lr_mult``, so the cosine schedule over rounds moves both together.

Forms (``momentum_form``, ``ortho``): the default ``"ema"`` + ``"ns5"`` is Keller Jordan's Muon, run by
``torch.optim.Muon``; ``momentum_form="sum"`` (B <- mu B + G) and/or ``ortho="svd"`` (the exact U V^T) run
:class:`fedhf.optim.muon_exact.ExactMuon` instead -- with ``nesterov=False`` that is FedMuon's Algorithm 1
(docs/algorithms.md 1.3, 2.8, 5.4).

``newton_schulz`` (the default form only): ``"torch"`` (default) steps ``torch.optim.Muon``; ``"batched"`` steps
:class:`fedhf.optim.muon_batched.BatchedMuon` -- the same math, Newton-Schulz batched over matrices of one shape and,
on a CPU without bfloat16 matmul units (AVX2), its bfloat16 products run as float32 matmuls (~20x faster there; a
few bfloat16 ulps from torch's numbers; benchmarks/optimizer_cost.py measures both); ``"gram"`` steps BatchedMuon
with the iteration on each matrix's Gram matrix, in float32 (:mod:`fedhf.optim.gram_newton_schulz`: 4-5x fewer
flops for LoRA factors and an embedding routed here, float32 rounding from the exact iteration).
"""

from __future__ import annotations

from functools import partial
from typing import Dict, Iterable, List, Mapping, Tuple, Union

import torch

from .base import FederatedOptimizer, TensorDict, split_theta_key, theta_key
from .muon_batched import BatchedMuon
from .muon_exact import MOMENTUM_FORMS, ORTHOGONALISATIONS, ExactMuon
from .newton_schulz_pool import muon_step_parts
from .state_size import adamw_bytes, copies

ROUTINGS = ("ndim>=2", "hidden_only")
NEWTON_SCHULZ = {"torch": torch.optim.Muon, "batched": BatchedMuon, "gram": partial(BatchedMuon, iteration="gram")}
#: Name fragments of embeddings and output heads, which "hidden_only" keeps off Muon.
_NOT_HIDDEN = ("embed", "classifier", "lm_head", "score", "pooler", "head")


def route_to_muon(name: str, param: torch.Tensor, routing: str) -> bool:
    if param.ndim < 2 or (param.ndim > 2 and not param.is_contiguous()):
        return False
    return routing == "ndim>=2" or not any(fragment in name.lower() for fragment in _NOT_HIDDEN)


def as_matrix(param: torch.Tensor) -> torch.Tensor:
    """The (shape[0], rest) view Muon sees, sharing storage: updating it in place updates ``param``."""
    return param if param.ndim == 2 else param.detach().view(param.shape[0], -1)


class MuonAdamW(FederatedOptimizer):
    """Muon on the routed matrices plus AdamW on everything else, stepped together.

    ``params``: ``named_parameters()`` pairs (needed for ``hidden_only``) or plain tensors (routed by shape).
    Theta = the Muon momentum buffers (``"momentum_buffer:<name>"``), what FedMuon and FedPAC_Muon average; the
    AdamW state of the other tensors is not Theta and restarts every round (docs/algorithms.md 2.8, 2.9a).
    """

    theta_keys = ("momentum_buffer",)

    def __init__(self, params: Iterable[Union[torch.Tensor, Tuple[str, torch.Tensor]]], lr: float = 3e-4,
                 muon_lr_mult: float = 100.0, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.01, betas: Tuple[float, float] = (0.9, 0.95), eps: float = 1e-10,
                 ns_steps: int = 5, adjust_lr_fn: Union[str, None] = None, routing: str = "ndim>=2",
                 momentum_form: str = "ema", ortho: str = "ns5", newton_schulz: str = "torch") -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"`routing` must be one of {ROUTINGS}, got {routing!r}.")
        if momentum_form not in MOMENTUM_FORMS or ortho not in ORTHOGONALISATIONS:
            raise ValueError(f"`momentum_form` must be one of {MOMENTUM_FORMS} and `ortho` one of "
                             f"{ORTHOGONALISATIONS}, got {momentum_form!r}, {ortho!r}.")
        if newton_schulz not in NEWTON_SCHULZ:
            raise ValueError(f"`newton_schulz` must be one of {tuple(NEWTON_SCHULZ)}, got {newton_schulz!r}.")
        exact = (momentum_form, ortho) != ("ema", "ns5")
        if exact and (ns_steps != 5 or adjust_lr_fn not in (None, "original") or newton_schulz != "torch"):
            raise ValueError("`momentum_form='sum'` / `ortho='svd'` run fedhf's ExactMuon, which has 5 Newton-Schulz "
                             "steps and the 'original' lr scaling only: leave `ns_steps`, `adjust_lr_fn` and "
                             "`newton_schulz` unset.")
        named = [(item if isinstance(item, tuple) else (f"param{i}", item)) for i, item in enumerate(params)]
        # Muon's tensor -> the parameter it is (a 2-D parameter itself, or the matrix view of a conv filter).
        self.muon_params: Dict[torch.Tensor, torch.Tensor] = {
            as_matrix(p): p for n, p in named if route_to_muon(n, p, routing)}
        self._views = [(matrix, p) for matrix, p in self.muon_params.items() if matrix is not p]  # conv filters
        others: List[torch.Tensor] = [p for n, p in named if not route_to_muon(n, p, routing)]
        self.muon_lr_mult, self.momentum_form, self.ortho = muon_lr_mult, momentum_form, ortho
        if not self.muon_params:
            self.muon = None
        elif exact:
            self.muon = ExactMuon(list(self.muon_params), lr=lr * muon_lr_mult, momentum=momentum, nesterov=nesterov,
                                  weight_decay=weight_decay, momentum_form=momentum_form, ortho=ortho)
        else:
            self.muon = NEWTON_SCHULZ[newton_schulz](list(self.muon_params), lr=lr * muon_lr_mult, momentum=momentum,
                                                     nesterov=nesterov, weight_decay=weight_decay, ns_steps=ns_steps,
                                                     adjust_lr_fn=adjust_lr_fn)
        self.adamw = torch.optim.AdamW(others, lr=lr, betas=tuple(betas), eps=eps,
                                       weight_decay=weight_decay) if others else None
        super().__init__(named, {"lr": lr})

    @classmethod
    def state_bytes(cls, params, routing: str = "ndim>=2", **kwargs) -> int:
        """One momentum buffer per Muon matrix (the gradient's dtype); AdamW's m, v and step for the rest."""
        muon = {n: p for n, p in params.items() if route_to_muon(n, p, routing)}
        return copies(muon, 1) + adamw_bytes({n: p for n, p in params.items() if n not in muon})

    def export_theta(self) -> TensorDict:
        if self.muon is None:
            return {}
        out = {}  # in parameter order, whatever order the buffers were created or imported in
        for matrix, p in self.muon_params.items():
            buffer = self.muon.state.get(matrix, {}).get("momentum_buffer")
            if buffer is not None:
                out[theta_key("momentum_buffer", self.param_names[p])] = buffer.detach().float().reshape(p.shape).clone()
        return out

    def import_theta(self, theta: Mapping[str, torch.Tensor]) -> None:
        matrices = {self.param_names[p]: matrix for matrix, p in self.muon_params.items()}
        for key, value in theta.items():
            state_key, name = split_theta_key(key)
            if state_key != "momentum_buffer" or name not in matrices:
                raise KeyError(f"MuonAdamW has no Theta entry {key!r}")
            matrix = matrices[name]
            # torch.optim.Muon and ExactMuon create the buffer only when absent, so a warm-started one is kept.
            self.muon.state[matrix]["momentum_buffer"] = (
                value.detach().to(device=matrix.device, dtype=matrix.dtype).reshape(matrix.shape).clone())

    def state_owners(self):
        """Muon's state keyed by its matrices (a conv filter's matrix view), AdamW's by the other parameters."""
        owners = []
        if self.muon is not None:
            owners.append((self.muon, {matrix: self.param_names[p] for matrix, p in self.muon_params.items()}))
        if self.adamw is not None:
            owners.append((self.adamw, self.param_names))
        return owners

    @property
    def inner(self) -> List[torch.optim.Optimizer]:
        return [o for o in (self.muon, self.adamw) if o is not None]

    def update(self) -> None:
        self._view_grads()
        for optimizer in self.inner:
            optimizer.step()
        self._view_grads(clear=True)

    def step_parts(self):
        """The step with Muon's Newton-Schulz iterations requested from the caller (batched clients run every
        client's at once: fedhf/optim/newton_schulz_pool.py) where they are BatchedMuon's (``newton_schulz``
        "batched" or "gram"); torch.optim.Muon and ExactMuon step whole (the pool's docstring says why)."""
        if not isinstance(self.muon, BatchedMuon):
            self.step()
            return
        self._view_grads()
        yield from muon_step_parts(self.muon)
        if self.adamw is not None:
            self.adamw.step()
        self._view_grads(clear=True)

    def _view_grads(self, clear: bool = False) -> None:
        """A conv filter's gradient seen as its matrix view for the step (``clear``: released after it)."""
        for matrix, p in self._views:
            matrix.grad = None if clear or p.grad is None else p.grad.reshape(matrix.shape)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict() if self.muon else None,
                "adamw": self.adamw.state_dict() if self.adamw else None}

    def load_state_dict(self, state_dict: dict) -> None:
        for key, optimizer in (("muon", self.muon), ("adamw", self.adamw)):
            if optimizer is not None:
                optimizer.load_state_dict(state_dict[key])
