"""Config checks that run in ``FederatedConfig.__post_init__``, before any model, data or file is touched.

Each raises ``ValueError`` naming the field and the fix. Trainer settings that the round loop replaces are
checked in :mod:`fedhf.trainer.settings`; data checks are in :mod:`fedhf.data.checks`.
"""

from __future__ import annotations

import dataclasses
import os
import typing
import warnings

import torch

from ..runtime.hardware import cpu_has_bf16_matmul

_NUMBERS = {"float": float, "int": int}


def _numeric_type(annotation) -> typing.Optional[type]:
    """float or int for a field annotated float/int/Optional[float]/Optional[int] (as a type or, under
    ``from __future__ import annotations``, as a string); None for anything else (str, bool, unions with str)."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    text = text.replace("typing.", "").replace("<class '", "").replace("'>", "").replace(" ", "")
    for name, kind in _NUMBERS.items():
        if text in (name, f"Optional[{name}]", f"Union[{name},NoneType]", f"{name}|None", f"Union[{name},None]"):
            return kind
    return None


def coerce_numeric_strings(config) -> None:
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; HfArgumentParser.parse_yaml_file passes it through. A string
    in a float/int field becomes the number, or the error names the field."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        kind = _numeric_type(f.type)
        if kind is None or not isinstance(value, str):
            continue
        try:
            number = float(value)
            if kind is int and not number.is_integer():
                raise ValueError
        except ValueError:
            example = "1.0e-3" if kind is float else "4"
            raise ValueError(f"`{f.name}` must be {'a float' if kind is float else 'an integer'}, got the string "
                             f"{value!r} (in YAML write numbers without quotes, e.g. `{f.name}: {example}`).") from None
        setattr(config, f.name, kind(number))


def check_output_dir(output_dir: typing.Optional[str]) -> None:
    if output_dir and os.path.isfile(output_dir):
        raise ValueError(f"`output_dir`={output_dir!r} is a file, not a folder: choose another output_dir or move "
                         "the file away.")


def check_batch_sizes(config) -> None:
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size"):
        if getattr(config, name) < 1:
            raise ValueError(f"`{name}` must be >= 1 (got {getattr(config, name)}): it is the rows per local step.")


def check_mixed_precision(config) -> None:
    """TrainingArguments already refuses bf16 without bf16 hardware unless `use_cpu`; fp16 on a CPU it accepts,
    and then trains in fp32 or fails inside accelerate. Refuse it here with the fix. bf16 on a CPU that emulates it
    is honoured, with a warning that names the faster setting."""
    on_cpu = config.use_cpu or not torch.accelerator.is_available()
    if on_cpu and (config.fp16 or config.fp16_full_eval):
        field = "fp16" if config.fp16 else "fp16_full_eval"
        raise ValueError(f"`{field}=True` needs a GPU, and this run is on the CPU: set {field}=False (or bf16=True "
                         "with use_cpu=True on a CPU with bf16 support).")
    if on_cpu and (config.bf16 or config.bf16_full_eval) and not cpu_has_bf16_matmul():
        field = "bf16" if config.bf16 else "bf16_full_eval"
        warnings.warn(f"`{field}=True` on a CPU without bfloat16 matmul units (no AVX512-BF16 or AMX): torch emulates "
                      f"bfloat16 there, ~17x slower than fp32 on a MiniLM-LoRA step measured on an AVX2 CPU. Set "
                      f"{field}=False to train in fp32 (faster here, and at least as precise).", UserWarning)
