"""Decoded optimizer states kept in their domain (the kinds of :mod:`fedhf.core.theta`).

A compressor approximates a tensor without knowing what it holds: an int2 code of a second moment plus its
error-feedback residual, or a rank-1 PowerSGD approximation of it, can have negative entries, and a symmetric PSD
factor (SOAP's L, R; FOOF's A) can come back indefinite. A client that warm-starts from a negative second moment
takes a non-finite step. So what a receiver decodes of a non-negative state is clamped at 0 and a symmetric PSD one
is projected onto the PSD cone (symmetrised, negative eigenvalues set to 0: the nearest PSD matrix in Frobenius
norm, Higham 1988). The uplink's residual is formed from the projected value (input - sent), so error feedback's
identity, sum of sent + residual = sum of inputs, still holds and what the projection removed is sent later.
"""

from __future__ import annotations

import torch

from ..core.theta import NONNEGATIVE, SYMMETRIC_PSD


def keep_domain(value: torch.Tensor, kind: str) -> torch.Tensor:
    """``value`` in the domain of ``kind``: clamped at 0 (non-negative), projected onto PSD (a square symmetric
    matrix), unchanged otherwise (general, or a PSD kind that is not a square matrix)."""
    if kind == NONNEGATIVE:
        return value.clamp_min(0)
    if kind == SYMMETRIC_PSD and value.ndim == 2 and value.shape[0] == value.shape[1]:
        symmetric = (value.double() + value.double().T) / 2
        eigenvalues, vectors = torch.linalg.eigh(symmetric)
        return ((vectors * eigenvalues.clamp_min(0)) @ vectors.T).to(value.dtype)
    return value
