"""PowerSGD: a rank-r approximation of each matrix by one step of subspace iteration, warm-started from the last
round's Q (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019, arXiv:1905.13727).

A tensor is read as the matrix M = (shape[0], rest). With Q (m x r) from the last round (drawn from the
generator the first time): P = orthonormalise(M Q) (n x r), Q' = M^T P (m x r); P and Q' go over the wire (fp32,
bytes 4 r (n + m)) and decode to P Q'^T = P P^T M, the projection of M on span(P), so ||M - decode|| <= ||M||.
Q' is the next round's warm start (kept by the caller: per client for the uplink, on the server for the
downlink). A 1-D tensor, or one where r (n + m) >= n m, is sent dense (fp32). Biased; meant with error feedback,
as in the paper.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .base import COMPRESSORS, Compressor, Encoded


def orthonormalise(p: torch.Tensor) -> torch.Tensor:
    """Q of the reduced QR: orthonormal columns spanning those of p (Gram-Schmidt in the paper)."""
    return torch.linalg.qr(p, mode="reduced").Q


class PowerSGD(Compressor):
    name = "powersgd"
    unbiased = False
    linear = False  # each client's P spans its own subspace
    stateful = True

    def __init__(self, rank: int) -> None:
        if rank < 1:
            raise ValueError(f"powersgd takes a rank >= 1, got {rank}.")
        self.rank = rank

    def compresses(self, shape) -> bool:
        if len(shape) < 2:
            return False
        n, m = shape[0], math.prod(shape[1:])
        return self.rank * (n + m) < n * m

    def encode(self, x: torch.Tensor, generator: torch.Generator, state: Optional[torch.Tensor] = None) -> Encoded:
        if not self.compresses(x.shape):
            return Encoded({"values": x.to(torch.float32)}, tuple(x.shape))
        matrix = x.to(torch.float64).reshape(x.shape[0], -1)
        q = state if state is not None else torch.randn(matrix.shape[1], self.rank, generator=generator,
                                                        dtype=torch.float64, device=x.device)
        p = orthonormalise(matrix @ q.to(torch.float64)).to(torch.float32)
        q_new = (matrix.T @ p.to(torch.float64)).to(torch.float32)
        return Encoded({"p": p, "q": q_new}, tuple(x.shape), state=q_new.to(torch.float64))

    def decode(self, encoded: Encoded) -> torch.Tensor:
        if "values" in encoded.tensors:
            return super().decode(encoded)
        p, q = encoded.tensors["p"].to(torch.float64), encoded.tensors["q"].to(torch.float64)
        return (p @ q.T).reshape(encoded.shape)

    def spec(self) -> str:
        return f"powersgd:{self.rank}"


@COMPRESSORS.register("powersgd")
def _powersgd(arg: Optional[str]) -> Compressor:
    try:
        return PowerSGD(4 if arg is None else int(arg))
    except ValueError as error:
        raise ValueError(f"powersgd:<rank>, e.g. powersgd:4 ({error})") from None
