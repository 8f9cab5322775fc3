"""Low-rank compressed state sync: FedMuon_SVD (Liu et al., 2025) and FedPAC's "_light" variants (Liu et al.,
"Taming Preconditioner Drift", Table 6/11); docs/algorithms.md 2.8, 2.9d, 5.6.

Each client uploads, for every state tensor with ndim >= 2 reshaped to (m, n) = (shape[0], rest), a rank-r
factorisation with r = max(1, floor(c m n / (m + n + 1))), so the upload is about a fraction c of the tensor;
when r (m + n + 1) >= m n the factorisation would not be smaller and the tensor is sent dense (e.g. LoRA A of
16 x 768 at c = 0.05). Kinds of state (declared by the optimizer beside its Theta keys, :mod:`fedhf.core.theta`) get
the factorisation that keeps their structure:

* general (Muon momentum): truncated SVD U_r diag(S_r) V_r^T, r (m + n + 1) floats;
* symmetric PSD (SOAP's factors L, R): truncated eigendecomposition U_r diag(S_r) U_r^T, r (m + 1) floats,
  which stays PSD;
* non-negative (Sophia's h): truncated SVD clamped at 0 -- a negative h would flip the sign of Sophia's step.

1-D state is sent dense. Compression is nonlinear, so each client contributes its dense reconstruction to the
sums (identical to the server reconstructing and averaging); the bytes reported are the compressed sizes.

Under FSDP each process holds its rows of every Theta tensor (``ctx.layout``, fedhf/runtime/sharded.py), and a
factorisation of rows is not one of the matrix (another rank, up to P r in all; SOAP's L, R would not even be
square): each tensor is gathered whole, one at a time, every process factorises the same matrix alike and keeps
its rows of the reconstruction, and process 0 alone counts the factorisation's bytes (the bytes of the round are
summed over processes). The averaged Theta is one process's. The
reference code passes ``args.beta1`` as c (0.9 in its README commands); here c is its own argument.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Tuple

import torch

from ..core.context import ClientContext
from ..core.message import Message
from ..core.params import TensorDict
from ..core.theta import GENERAL, NONNEGATIVE, SYMMETRIC_PSD
from .rules import AverageWarmstart, upload


def compression_rank(m: int, n: int, fraction: float) -> int:
    return max(1, math.floor(fraction * m * n / (m + n + 1)))


def low_rank(tensor: torch.Tensor, fraction: float, kind: str = GENERAL) -> Tuple[torch.Tensor, int]:
    """(reconstruction, floats sent) of one state tensor under the rank rule above."""
    if tensor.ndim < 2:
        return tensor.clone(), tensor.numel()
    matrix = tensor.reshape(tensor.shape[0], -1).double()
    m, n = matrix.shape
    r = compression_rank(m, n, fraction)
    if kind == SYMMETRIC_PSD and m == n:
        if r * (m + 1) >= m * n:
            return tensor.clone(), tensor.numel()
        values, vectors = torch.linalg.eigh(matrix)
        top = values.abs().argsort(descending=True)[:r]
        recon = (vectors[:, top] * values[top]) @ vectors[:, top].T
        return recon.to(tensor.dtype).reshape(tensor.shape), r * (m + 1)
    if r * (m + n + 1) >= m * n:
        return tensor.clone(), tensor.numel()
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    recon = (u[:, :r] * s[:r]) @ vh[:r]
    if kind == NONNEGATIVE:
        recon = recon.clamp_min(0)
    return recon.to(tensor.dtype).reshape(tensor.shape), r * (m + n + 1)


class CompressedAverage(AverageWarmstart):
    """``average_warmstart`` with a low-rank upload of Theta (``fraction`` = c; 0.05 for Muon and Sophia, 0.1 for
    SOAP in the papers). The broadcast Thetabar is dense, as in the papers (they count only the uplink)."""

    name = "compressed_average"

    def __init__(self, fraction: float = 0.05) -> None:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"`state_sync_kwargs.fraction` must be in (0, 1), got {fraction}.")
        self.fraction = float(fraction)

    def client_end(self, ctx: ClientContext, theta: TensorDict, kinds: Optional[Mapping[str, str]] = None) -> Message:
        recon, floats, layout = {}, 0, ctx.layout
        for key, tensor in theta.items():  # under FSDP: one whole matrix at a time, this process's rows kept
            whole, sent = low_rank(layout.gather(tensor), self.fraction, (kinds or {}).get(key, GENERAL))
            recon[key] = layout.local_part(whole)
            floats += sent
        return upload(ctx, recon, nbytes=4 * floats if layout.rank == 0 else 0)  # counted once over processes
