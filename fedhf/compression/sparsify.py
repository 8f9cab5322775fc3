"""Top-k sparsification: the k = ceil(fraction n) entries of largest magnitude, as fp32 values and int32 flat
indices (Stich et al., "Sparsified SGD with Memory", NeurIPS 2018, arXiv:1809.07599; Aji and Heafield, EMNLP 2017,
arXiv:1704.05021). Bytes: 8 k. Biased; with error feedback the dropped entries are sent later. The kept entries
are exact up to the fp32 cast, so ||x - decode||^2 <= (1 - k/n) ||x||^2 (plus the cast).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .base import COMPRESSORS, Compressor, Encoded


class TopK(Compressor):
    name = "topk"
    unbiased = False
    linear = False  # each client keeps its own support

    def __init__(self, fraction: float) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"topk takes a fraction in (0, 1], got {fraction}.")
        self.fraction = fraction

    def encode(self, x: torch.Tensor, generator: torch.Generator, state: Optional[torch.Tensor] = None) -> Encoded:
        flat = x.reshape(-1)
        k = max(1, math.ceil(self.fraction * flat.numel()))
        # Sorted indices: the same support in the same order whatever order topk returns ties in.
        indices = torch.topk(flat.abs(), k, sorted=False).indices.sort().values
        return Encoded({"values": flat[indices].to(torch.float32), "indices": indices.to(torch.int32)},
                       tuple(x.shape))

    def decode(self, encoded: Encoded) -> torch.Tensor:
        values = encoded.tensors["values"]
        out = torch.zeros(math.prod(encoded.shape), dtype=torch.float64, device=values.device)
        out[encoded.tensors["indices"].long()] = values.to(torch.float64)
        return out.reshape(encoded.shape)

    def spec(self) -> str:
        return f"topk:{self.fraction:g}"


@COMPRESSORS.register("topk")
def _topk(arg: Optional[str]) -> Compressor:
    try:
        return TopK(0.01 if arg is None else float(arg))
    except ValueError as error:
        raise ValueError(f"topk:<fraction>, e.g. topk:0.01 ({error})") from None
