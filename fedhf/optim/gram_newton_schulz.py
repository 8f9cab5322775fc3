"""Gram Newton-Schulz: Muon's quintic iteration run on the small Gram matrix (a cheaper Muon step, off by default).

Dao, Zhang, Amsel and Chen, 2026, "Gram Newton-Schulz: a fast, hardware-aware Newton-Schulz algorithm for Muon"
(tridao.me/blog/2026/gram-newton-schulz; github.com/Dao-AILab/gram-newton-schulz). For a wide n x m matrix X_0
(n <= m, normalised), each Newton-Schulz step is X_{k+1} = P_k X_k with P_k = a I + b A_k + c A_k^2 and
A_k = X_k X_k^T. Every P_k is a polynomial in A_0, so X_k = Q_k X_0 with::

    Q_{k+1} = P_k Q_k        A_{k+1} = X_{k+1} X_{k+1}^T = P_k A_k P_k

and after A_0 the iteration never touches the long side m again until the final X = Q X_0. The same steps in exact
arithmetic; only the rounding differs. Multiply-adds for five steps (counted as 2 flops): the usual iteration
20 n^2 m + 10 n^3, this one 4 n^2 m + 34 n^3 -- fewer from m > 1.5 n, 4.3x fewer for a LoRA factor of r = 8 by
d = 384, 4.7x for a 64 x 10,240 embedding. Near-square matrices (m < 2 n) keep the usual iteration.

Everything here runs in float32. The authors run half precision and restart the Gram iteration part-way, because in
bfloat16 A_k can drift to spurious negative eigenvalues; in float32 over five steps the two forms agree to float32
rounding (tests/optim/test_gram_newton_schulz.py), so no restart is needed. On a GPU with fast bfloat16 the
authors' half-precision kernels would be faster than this; on CPUs without bfloat16 units (AVX2), float32 is the
fast precision anyway.
"""

from __future__ import annotations

import torch

from .muon_exact import NS5_COEFFICIENTS

GRAM_MIN_ASPECT = 2.0  # m / n from which the Gram form is used (its flop count breaks even at 1.5)


def newton_schulz(x: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The usual iteration X <- a X + (b A + c A A) X, A = X X^T, on a stack (k, n, m) of wide normalised matrices."""
    a, b, c = NS5_COEFFICIENTS
    for _ in range(steps):
        gram = torch.bmm(x, x.transpose(1, 2))
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x


def gram_newton_schulz(x: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The same ``steps`` on the Gram matrix: returns Q X_0 for a stack (k, n, m) of wide normalised matrices."""
    a, b, c = NS5_COEFFICIENTS
    gram = torch.bmm(x, x.transpose(1, 2))
    eye = torch.eye(x.size(1), dtype=x.dtype, device=x.device).expand_as(gram)
    q = None
    for step in range(steps):
        poly = torch.baddbmm(b * gram + a * eye, gram, gram, alpha=c)  # P = a I + b A + c A^2
        q = poly if q is None else torch.bmm(poly, q)
        if step < steps - 1:  # the last step's A is never used
            gram = torch.bmm(poly, torch.bmm(gram, poly))
    return x if q is None else torch.bmm(q, x)


def orthogonalise(x: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Newton-Schulz of a float32 stack (k, n, m), n <= m, normalised: the Gram form where it saves work."""
    wide_enough = x.size(2) >= GRAM_MIN_ASPECT * x.size(1)
    return gram_newton_schulz(x, steps) if wide_enough else newton_schulz(x, steps)
