"""Muon in the forms ``torch.optim.Muon`` does not offer, for FedMuon's exact Algorithm 1 (docs/algorithms.md 1.3, 2.8).

Liu et al., 2025, "FedMuon: Accelerating Federated Learning with Matrix Orthogonalization", Algorithm 1, writes the
local step as M <- beta M + G ; (U, S, V) = SVD(M) ; x <- x - eta U V^T (the sum form, no Nesterov, the exact
polar factor), where the authors' code and :class:`torch.optim.Muon` use Keller Jordan's form (EMA momentum with
Nesterov, five quintic Newton-Schulz steps in bfloat16, github.com/KellerJordan/Muon). Per 2-D parameter::

    momentum_form "ema":  B <- mu B + (1 - mu) G ;  U = (1 - mu) G + mu B  if nesterov else B
    momentum_form "sum":  B <- mu B + G          ;  U = G + mu B            if nesterov else B
    ortho "ns5": O = NS5(U) (Keller Jordan's coefficients, bfloat16, as torch.optim.Muon)
    ortho "svd": O = U_ V_^T from the SVD of U in float32 (float64 for a float64 U); singular values at or below
                 1e-7 * the largest count as 0, so O(0) = 0 like NS5(0) (a LoRA A at init has G = 0)
    p <- p (1 - lr wd) ;  p <- p - lr sqrt(max(1, rows / cols)) O          ("original" lr scaling, as torch)

Orthogonalisation ignores a positive scale of U, so without Nesterov the sum and EMA forms take the same steps; their
momentum buffers (Theta, what FedMuon averages) differ by the factor 1 / (1 - mu). ema + ns5 is torch.optim.Muon's
math (MuonAdamW uses torch's then). The lr scaling keeps torch's default (1 for square or wide matrices); the paper's
U V^T has none. The step is fedhf's one Muon step (fedhf/optim/muon_step.py) with these orthogonalisers.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from .muon_step import Orthogonaliser, muon_step

MOMENTUM_FORMS = ("ema", "sum")
ORTHOGONALISATIONS = ("ns5", "svd")
NS5_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz5(update: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Five quintic Newton-Schulz steps in bfloat16: X <- a X + (b A + c A A) X, A = X X^T (wide orientation)."""
    a, b, c = NS5_COEFFICIENTS
    x = update.bfloat16()
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(5):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def polar_factor(update: torch.Tensor, rel_tol: float = 1e-7) -> torch.Tensor:
    """U V^T of the SVD, the exact orthogonalisation; directions of singular value <= rel_tol * max dropped."""
    matrix = update.to(torch.promote_types(update.dtype, torch.float32))
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    keep = (s > rel_tol * s.max().clamp(min=torch.finfo(s.dtype).tiny)).to(s.dtype)
    return (u * keep) @ vh


class ExactMuon(torch.optim.Optimizer):
    """Muon on 2-D parameters with a selectable ``momentum_form`` and ``ortho`` (see the module docstring).
    State key ``momentum_buffer``, created only when absent, so an imported Theta survives the first step."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, momentum: float = 0.95,
                 nesterov: bool = True, weight_decay: float = 0.0, momentum_form: str = "ema", ortho: str = "ns5"):
        if momentum_form not in MOMENTUM_FORMS:
            raise ValueError(f"`momentum_form` must be one of {MOMENTUM_FORMS}, got {momentum_form!r}.")
        if ortho not in ORTHOGONALISATIONS:
            raise ValueError(f"`ortho` must be one of {ORTHOGONALISATIONS}, got {ortho!r}.")
        if lr < 0 or weight_decay < 0 or not 0.0 <= momentum < 1.0:
            raise ValueError(f"ExactMuon: invalid lr={lr}, weight_decay={weight_decay} or momentum={momentum}.")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                                      momentum_form=momentum_form, ortho=ortho))
        for group in self.param_groups:
            if any(p.ndim != 2 for p in group["params"]):
                raise ValueError("ExactMuon takes 2-D parameters only (view conv filters as (out, rest)).")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            orthogonalise = _per_matrix(newton_schulz5 if group["ortho"] == "ns5" else polar_factor)
            for p in group["params"]:  # one matrix at a time
                if p.grad is not None:
                    muon_step(self.state, [p], group, orthogonalise, group["momentum_form"])
        return loss


def _per_matrix(orthogonalise: Callable[[torch.Tensor], torch.Tensor]) -> Orthogonaliser:
    """Each update orthogonalised by itself, in the update's dtype (the parameter's)."""
    return lambda updates: [orthogonalise(u).to(u.dtype) for u in updates]
