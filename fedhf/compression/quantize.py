"""Quantisers: a cast to a 16-bit float (bf16, fp16) and blockwise b-bit integer quantisation with stochastic
rounding (int8, int4).

Blockwise quantisation (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022,
arXiv:2110.02861) splits the flattened tensor into blocks of ``block`` values and scales each block by its own
absolute maximum, so one outlier costs the precision of its block only. Each block is sent as ``block`` signed
codes q in [-L, L] (L = 2^(b-1) - 1: 127 for 8 bits, 7 for 4 bits, 1 for 2 bits; 8/b codes per byte) plus one
fp32 scale s = absmax/L; it decodes to q s. Bytes: ceil(n b / 8) + 4 ceil(n / block).

The codes are rounded *stochastically*: y = x / s rounds up with probability y - floor(y), so E[q s] = x exactly
(unbiased; Alistarh et al., QSGD, NeurIPS 2017, arXiv:1610.02132) and every entry is off by less than one step s.
bitsandbytes' ``quantize_blockwise`` runs on CPU tensors here (0.50.2) but rounds to the nearest code of its
non-linear dynamic map, deterministically: biased, so the unbiased variant needed without error feedback is
written here in torch (a few lines).

The 16-bit casts round to nearest (biased, relative error at most 2^-9 for bf16, 2^-11 for fp16 in their normal
range). An fp16 overflow (|x| > 65504) is refused rather than sent as inf.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .base import COMPRESSORS, Compressor, Encoded


class Cast(Compressor):
    """Round to a 16-bit float: 2 bytes a value."""

    unbiased = False
    linear = False

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.dtype = name, dtype

    def encode(self, x: torch.Tensor, generator: torch.Generator, state: Optional[torch.Tensor] = None) -> Encoded:
        values = x.to(self.dtype)
        if not torch.isfinite(values).all() and torch.isfinite(x).all():
            raise ValueError(f"{self.name} overflows on a value of magnitude {float(x.abs().max()):.3g}; "
                             "use bf16 (fp32's range) or an integer quantiser")
        return Encoded({"values": values}, tuple(x.shape))


def quantize_codes(x: torch.Tensor, levels: int, block: int, generator: torch.Generator):
    """(codes in [-levels, levels] as int8, fp32 scale per block) of a flat float64 tensor, stochastically rounded."""
    n = x.numel()
    padded = torch.nn.functional.pad(x.reshape(-1), (0, (-n) % block)).reshape(-1, block)
    scale = (padded.abs().amax(dim=1) / levels).to(torch.float32)  # the wire scale: fp32
    divisor = scale.to(torch.float64).clamp_min(torch.finfo(torch.float64).tiny).unsqueeze(1)
    y = (padded / divisor).clamp(-levels, levels)  # |y| <= levels up to the fp32 rounding of the scale
    u = torch.rand(y.shape, generator=generator, dtype=torch.float64, device=y.device)
    codes = torch.floor(y + u).clamp(-levels, levels).to(torch.int8)
    return codes.reshape(-1)[:n], scale


def dequantize_codes(codes: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    n = codes.numel()
    padded = torch.nn.functional.pad(codes.to(torch.float64), (0, (-n) % block)).reshape(-1, block)
    return (padded * scale.to(torch.float64).unsqueeze(1)).reshape(-1)[:n]


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """8 / bits codes in [-L, L] per byte (offset by L + 1 into a field of ``bits`` bits)."""
    per = 8 // bits
    fields = (codes.to(torch.int16) + 2 ** (bits - 1)).to(torch.uint8)
    fields = torch.cat([fields, fields.new_zeros((-fields.numel()) % per)]).reshape(-1, per)
    packed = torch.zeros(fields.shape[0], dtype=torch.uint8, device=fields.device)
    for j in range(per):
        packed |= fields[:, j] << (bits * j)
    return packed


def unpack(packed: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    per, mask = 8 // bits, 2 ** bits - 1
    fields = torch.stack([(packed >> (bits * j)) & mask for j in range(per)], dim=1).reshape(-1)[:n]
    return fields.to(torch.int16).sub(2 ** (bits - 1)).to(torch.int8)


class Blockwise(Compressor):
    """b-bit blockwise quantisation with stochastic rounding (``bits`` 8, 4 or 2; 2 bits: codes -1, 0, 1)."""

    unbiased = True
    linear = False  # each client's block scales are its own

    def __init__(self, bits: int, block: int) -> None:
        if block < 1:
            raise ValueError(f"int{bits} block size must be >= 1, got {block}.")
        self.bits, self.block, self.levels = bits, block, 2 ** (bits - 1) - 1
        self.name = f"int{bits}"

    def encode(self, x: torch.Tensor, generator: torch.Generator, state: Optional[torch.Tensor] = None) -> Encoded:
        codes, scale = quantize_codes(x.to(torch.float64), self.levels, self.block, generator)
        payload = codes if self.bits == 8 else pack(codes, self.bits)
        return Encoded({"codes": payload, "scale": scale}, tuple(x.shape))

    def decode(self, encoded: Encoded) -> torch.Tensor:
        n = math.prod(encoded.shape)
        codes = encoded.tensors["codes"]
        codes = codes if self.bits == 8 else unpack(codes, n, self.bits)
        return dequantize_codes(codes, encoded.tensors["scale"], self.block).reshape(encoded.shape)

    def spec(self) -> str:
        return f"{self.name}:{self.block}"


def _block(arg: Optional[str], default: int, name: str) -> int:
    try:
        return default if arg is None else int(arg)
    except ValueError:
        raise ValueError(f"{name} takes a block size (an integer), got {arg!r}.") from None


def _no_arg(name: str, arg: Optional[str]) -> None:
    if arg is not None:
        raise ValueError(f"Compressor {name!r} takes no argument, got {arg!r}.")


@COMPRESSORS.register("bf16")
def _bf16(arg: Optional[str]) -> Compressor:
    _no_arg("bf16", arg)
    return Cast("bf16", torch.bfloat16)


@COMPRESSORS.register("fp16")
def _fp16(arg: Optional[str]) -> Compressor:
    _no_arg("fp16", arg)
    return Cast("fp16", torch.float16)


@COMPRESSORS.register("int8")
def _int8(arg: Optional[str]) -> Compressor:
    return Blockwise(8, _block(arg, 256, "int8"))  # 4/256 = 1.6 % of scale metadata


@COMPRESSORS.register("int4")
def _int4(arg: Optional[str]) -> Compressor:
    return Blockwise(4, _block(arg, 64, "int4"))  # bitsandbytes' 4-bit block: 4/32 = 12.5 % metadata


@COMPRESSORS.register("int2")
def _int2(arg: Optional[str]) -> Compressor:
    return Blockwise(2, _block(arg, 64, "int2"))  # MuLoCo's 2 bits: codes -1, 0, 1 and a scale per block
