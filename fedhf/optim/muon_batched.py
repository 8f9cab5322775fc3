"""``torch.optim.Muon``'s math with the Newton-Schulz iterations batched over matrices of one shape (cheaper, off).

torch.optim.Muon (torch 2.13, ``_single_tensor_muon``; Keller Jordan's Muon, github.com/KellerJordan/Muon)
orthogonalises one matrix at a time: five quintic Newton-Schulz steps in bfloat16, each three small matmuls. A
LoRA model has dozens of factors of a few shapes (every query/key/value A is r x d), and a transformer's full
weights repeat one shape per layer, so per-matrix dispatch dominates on small factors. Here the matrices are
grouped by their *oriented* shape (a tall m x n matrix is iterated as its n x m transpose, as torch does, so a
LoRA B of d x r joins the r x d A's), stacked, and iterated with ``torch.baddbmm`` -- the same operations on the
same bfloat16 values, one batched call per group instead of one call per matrix. Per parameter, unchanged::

    B <- B + (1 - mu)(G - B)                        (torch's lerp)
    U = G + mu (B - G) if nesterov else B
    X = NS5(U / ||U||_F) in bfloat16                (per matrix: its own Frobenius norm)
    p <- p (1 - lr wd) ;  p <- p - lr sqrt(max(1, rows / cols)) X   ("original" lr scaling)

The state (``momentum_buffer`` per parameter) is torch.optim.Muon's, so Theta export/import and state_dicts are
unchanged.

``matmul`` says how the bfloat16 products run:
* ``"bfloat16"``: native bfloat16 ``bmm``/``baddbmm``, the operations torch runs per matrix (on CPU bit-identical
  for LoRA-sized factors; on 384 x 1536 blocks the batched kernel sums in another order: differences of a few
  bfloat16 ulps of the update).
* ``"float32_accumulate"``: every operand and result is still rounded to bfloat16 after each product, but the
  products are float32 matmuls of the bfloat16 values (exact products, float32 sums). On a CPU without bfloat16
  matmul units (AVX2: 1.3 GFLOP/s bfloat16 against 36 GFLOP/s float32 in this repository's measurement) this is
  ~20x faster; the result differs from torch's by a few bfloat16 ulps -- the size of torch's own bfloat16 error
  against the float32 iteration. ``None`` (default): :func:`default_matmul` (float32 products only on CPUs
  without bfloat16 matmul hardware).
tests/optim/test_muon_batched.py checks both against torch.optim.Muon.

``iteration="gram"`` runs the same five steps on each matrix's Gram matrix instead, in float32
(:mod:`fedhf.optim.gram_newton_schulz`): 4-5x fewer flops on LoRA factors and embeddings, the same math up to
float32 rounding (closer to the exact iteration than torch's bfloat16 one).
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import torch

from ..runtime.hardware import cpu_has_bf16_matmul
from .gram_newton_schulz import orthogonalise
from .muon_exact import NS5_COEFFICIENTS

NS_EPS = 1e-7  # torch.optim._muon EPS
MATMULS = ("bfloat16", "float32_accumulate")
ITERATIONS = ("standard", "gram")


def batched_newton_schulz(updates: List[torch.Tensor], ns_steps: int = 5, eps: float = NS_EPS,
                           matmul: str = "bfloat16", iteration: str = "standard") -> List[torch.Tensor]:
    """NS5 of each matrix in ``updates`` (all of one oriented shape), as torch's ``_zeropower_via_newtonschulz``.

    Each matrix is transposed to its wide orientation, normalised by its own Frobenius norm (computed per matrix
    in bfloat16, as torch does), and the stack is iterated X <- a X + (b A + c A A) X, A = X X^T, batched.
    Returns bfloat16 results in each input's own orientation. ``matmul``: see the module docstring.
    ``iteration="gram"``: float32 throughout (norms too), Gram form where the matrices are wide enough; float32
    results, ``matmul`` unused."""
    a, b, c = NS5_COEFFICIENTS
    tall = [u.size(0) > u.size(1) for u in updates]
    if iteration == "gram":
        x = torch.stack([(u.T if t else u).float() for u, t in zip(updates, tall)])
        x = orthogonalise(x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps), ns_steps)
        return [m.T if t else m for m, t in zip(x.unbind(0), tall)]
    x = torch.stack([(u.T if t else u).bfloat16() for u, t in zip(updates, tall)])
    # Per-matrix norms, each as torch computes it on its 2-D bfloat16 matrix (so the divisor is bit-identical).
    norms = torch.stack([m.norm() for m in x.unbind(0)]).clamp(min=eps)
    x = x / norms.view(-1, 1, 1)
    wide = matmul == "float32_accumulate"
    for _ in range(ns_steps):
        xm = x.float() if wide else x
        gram = torch.bmm(xm, xm.transpose(1, 2))
        gram = gram.bfloat16().float() if wide else gram  # rounded to bfloat16, as torch's product is
        gram_update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        gram_update = gram_update.bfloat16().float() if wide else gram_update
        x = torch.baddbmm(xm, gram_update, xm, beta=a).bfloat16()
    return [m.T if t else m for m, t in zip(x.unbind(0), tall)]


def default_matmul(device: torch.device) -> str:
    """``"bfloat16"`` where bfloat16 matmuls have hardware (GPUs; CPUs with AVX512-BF16 or AMX), else
    ``"float32_accumulate"`` (e.g. AVX2 CPUs, where torch's bfloat16 matmul is ~28x slower than float32)."""
    if device.type != "cpu":
        return "bfloat16"
    return "bfloat16" if cpu_has_bf16_matmul() else "float32_accumulate"


def oriented_shape(shape: torch.Size) -> Tuple[int, int]:
    """The shape Newton-Schulz iterates: the wide orientation (rows <= cols)."""
    rows, cols = shape
    return (cols, rows) if rows > cols else (rows, cols)


class BatchedMuon(torch.optim.Optimizer):
    """``torch.optim.Muon`` (defaults and state included) with Newton-Schulz batched per oriented shape.

    Supports the ``adjust_lr_fn`` values of torch (None/"original", "match_rms_adamw") and its coefficients."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5, adjust_lr_fn=None,
                 eps: float = NS_EPS, matmul: Optional[str] = None, iteration: str = "standard") -> None:
        if lr < 0 or weight_decay < 0 or momentum < 0:
            raise ValueError(f"BatchedMuon: invalid lr={lr}, weight_decay={weight_decay} or momentum={momentum}.")
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        if matmul not in (None, *MATMULS):
            raise ValueError(f"`matmul` must be one of {MATMULS} or None, got {matmul!r}.")
        if iteration not in ITERATIONS or (iteration == "gram" and matmul is not None):
            raise ValueError(f"`iteration` must be one of {ITERATIONS}, got {iteration!r}; 'gram' runs in float32, "
                             "so leave `matmul` unset with it.")
        if not 0 < ns_steps < 100:
            raise ValueError(f"`ns_steps` must be in 1..99, got {ns_steps}.")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn, eps=eps, matmul=matmul,
                                      iteration=iteration))
        for group in self.param_groups:
            if any(p.ndim != 2 for p in group["params"]):
                raise ValueError("BatchedMuon takes 2-D parameters only (view conv filters as (out, rest)).")

    def __setstate__(self, state: dict) -> None:  # torch's load_state_dict ends here
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("iteration", "standard")  # a state_dict saved before the option existed

    @torch.no_grad()
    def step(self, closure=None):
        from .newton_schulz_pool import muon_step_parts, run_alone  # (the pool iterates with this module's math)

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        run_alone(muon_step_parts(self))
        return loss
