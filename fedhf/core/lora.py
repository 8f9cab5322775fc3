"""The LoRA vocabulary: the role of a parameter name (``lora_A``, ``lora_B``, ``head``, ``norm``), the pairs of A and
B names, and a LoRA A drawn from a seed. The model's LoRA layers themselves are read in
:mod:`fedhf.runtime.lora_layers`.

Used by the parameter-sharing axis (:mod:`fedhf.sharing`) and the LoRA server rules (:mod:`fedhf.server.lora`),
which do not import each other.
"""

from __future__ import annotations

import math
import re
from typing import Dict, Optional

import torch

LORA_A, LORA_B, HEAD, NORM = "lora_A", "lora_B", "head", "norm"
ROLES = (LORA_A, LORA_B, HEAD, NORM)

# A head: peft's trainable copies (modules_to_save) or the usual head names of transformers models.
_HEAD_PARTS = {"modules_to_save", "classifier", "score", "lm_head", "head"}
# A normalisation layer: LayerNorm / RMSNorm / BatchNorm by the names transformers gives them.
_NORM_PART = re.compile(r".*norm.*|(ln|bn)(_?\d+|_f)?", re.IGNORECASE)


def role_of(name: str) -> Optional[str]:
    """The LoRA role of a parameter (or buffer) name, or None (any other tensor)."""
    parts = name.split(".")
    if any(p in ("lora_A", "lora_embedding_A") for p in parts):
        return LORA_A
    if any(p in ("lora_B", "lora_embedding_B") for p in parts):
        return LORA_B
    if any(p in _HEAD_PARTS for p in parts):
        return HEAD
    if any(_NORM_PART.fullmatch(p) for p in parts[:-1]):
        return NORM
    return None


def seeded_lora_a(shape, seed: int, index: int) -> torch.Tensor:
    """A LoRA A drawn as peft draws it (Kaiming uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))) from a
    generator seeded by (seed, index): every client rebuilds the same A from the run's seed, nothing is sent."""
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(index))
    bound = 1.0 / math.sqrt(shape[1])
    return (torch.rand(shape, generator=generator, dtype=torch.float32) * 2 - 1) * bound


def lora_pairs(names) -> Dict[str, str]:
    """A name -> B name for every ``...lora_A.<adapter>.weight`` among ``names`` whose B is there too."""
    names = set(names)
    pairs = {n: n.replace(".lora_A.", ".lora_B.") for n in names if ".lora_A." in n}
    return {a: b for a, b in sorted(pairs.items()) if b in names}
