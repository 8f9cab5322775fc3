"""Checks for quantised (QLoRA) bases, made before any work.

bitsandbytes replaces every ``nn.Linear`` of a model loaded with ``quantization_config=BitsAndBytesConfig(...)``,
including a head the checkpoint does not hold (e.g. a new ``classifier`` on a base encoder). The checkpoint's
weights are quantised on load (uint8 for 4-bit ``Params4bit``, int8 for ``Int8Params``); a new head is not, and
fails in its first forward (4-bit: an AssertionError after "FP4 quantization state not initialized"; 8-bit:
``'Parameter' object has no attribute 'CB'``). transformers leaves a causal LM's ``lm_head`` unquantised already.

And one setting made before any work: the 4-bit weights keep the layout training backpropagates through
(``keep_trainable_4bit_layout``). The trainer calls ``prepare_quantised_base``, which does both.
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


def keep_trainable_4bit_layout(model: torch.nn.Module) -> None:
    """Keep every 4-bit weight in the layout bitsandbytes trains through, for the whole federated run.

    bitsandbytes (0.49+) on a CPU with AVX512-BF16 repacks a ``Linear4bit`` weight on its first forward in eval mode
    without grad (``packing_format_for_cpu``) for its fused inference kernel, and keeps that layout. A later training
    forward then goes through the inference kernel, which no gradient crosses to the layer's input: every adapter
    below the last layer trains on a wrong gradient, and the frozen base changes bytes. The federated loop evaluates
    between rounds, so on such CPUs QLoRA stopped learning after the first evaluation (measured on an AMD EPYC with
    AVX512-BF16: eval loss 10.26 -> 10.07 over two rounds where AVX2 CPUs lower it by more than 0.2). Here the
    repack is turned off; evaluation then dequantises as training does, in the compute dtype the user chose.

    A weight repacked already (the model was evaluated before the trainer was built) is refused: the repack rounds
    the quantisation scales to bfloat16, so bitsandbytes' inverse does not give the loaded base back.
    bitsandbytes versions without the repack have neither attribute and nothing is done."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:
        return
    repacked = []
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        if hasattr(module, "support_avx512bf16_for_cpu"):  # bitsandbytes 0.49+: the switch for the repack
            module.support_avx512bf16_for_cpu = False
        if getattr(module.weight.quant_state, "packing_format_for_cpu", False):
            repacked.append(name)
    if repacked:
        raise ValueError(
            f"{len(repacked)} 4-bit layer(s) were repacked by bitsandbytes for CPU inference {repacked[:3]}: the model "
            f"ran a forward in eval mode without grad before FederatedTrainer was built, and that layout cannot be "
            f"trained. Load the model again and build the trainer before evaluating it (trainer.evaluate() is safe).")


def prepare_quantised_base(model: torch.nn.Module) -> None:
    """Everything a quantised base needs before the federated run: refused if a layer would fail, kept trainable."""
    check_quantised_layers(model)
    keep_trainable_4bit_layout(model)
