"""Checks for quantised (QLoRA) bases, made before any work.

bitsandbytes replaces every ``nn.Linear`` of a model loaded with ``quantization_config=BitsAndBytesConfig(...)``,
including a head the checkpoint does not hold (e.g. a new ``classifier`` on a base encoder). The checkpoint's
weights are quantised on load (uint8 for 4-bit ``Params4bit``, int8 for ``Int8Params``); a new head is not, and
fails in its first forward (4-bit: an AssertionError after "FP4 quantization state not initialized"; 8-bit:
``'Parameter' object has no attribute 'CB'``). transformers leaves a causal LM's ``lm_head`` unquantised already.
"""

from __future__ import annotations

import sys
from typing import List

import torch


def unquantised_layers(model: torch.nn.Module) -> List[str]:
    """Names of bitsandbytes 4/8-bit layers whose weight was never quantised (still floating point)."""
    bnb = sys.modules.get("bitsandbytes")  # no bitsandbytes loaded: no such layers either
    if bnb is None:
        return []
    kinds = (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
    return [name for name, module in model.named_modules()
            if isinstance(module, kinds) and module.weight.is_floating_point()]


def _module_name(name: str) -> str:
    """The layer's own name, without the wrappers peft puts around a head (``classifier.modules_to_save.default``,
    ``classifier.original_module``): what ``llm_int8_skip_modules`` matches."""
    parts = name.split(".")
    if "modules_to_save" in parts:
        parts = parts[:parts.index("modules_to_save")]
    while len(parts) > 1 and parts[-1] in ("original_module", "base_layer"):
        parts.pop()
    return parts[-1]


def check_quantised_layers(model: torch.nn.Module) -> None:
    names = unquantised_layers(model)
    if names:
        heads = sorted({_module_name(name) for name in names})
        raise ValueError(
            f"{len(names)} quantised layer(s) were never quantised and would fail in the first forward: "
            f"{names[:5]}. They are usually heads the checkpoint does not hold; keep them unquantised with "
            f"BitsAndBytesConfig(..., llm_int8_skip_modules={heads}).")
