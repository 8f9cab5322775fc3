"""What the machine can do, probed once where a setting depends on it."""

from __future__ import annotations

import torch


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX). Without it (e.g. AVX2) torch emulates
    bfloat16 matmuls: on this project's AVX2 machine a MiniLM-LoRA step took 10.1 s under bf16 autocast against
    0.59 s in fp32 (benchmarks/lora_federation.py)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
