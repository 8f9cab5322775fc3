"""Config checks that run in ``FederatedConfig.__post_init__``, before any model, data or file is touched.

Each raises ``ValueError`` naming the field and the fix. Trainer settings that the round loop replaces are
checked in :mod:`fedhf.trainer.config.settings`; data checks are in :mod:`fedhf.data.checks`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
import warnings

import torch

from ...data import PARTITION_KEYS, PARTITIONERS
from ...metrics.direction import default_greater_is_better
from ...runtime.hardware import cpu_has_bf16_matmul
from ...core.choices import not_one_of

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


def set_metric_direction(config) -> None:
    """``greater_is_better`` from fedhf's table (fedhf/metrics/direction.py) when ``metric_for_best_model`` is set
    and the direction is not, before TrainingArguments guesses "higher" for every name not ending in ``loss``."""
    if config.metric_for_best_model is not None and config.greater_is_better is None:
        config.greater_is_better = default_greater_is_better(config.metric_for_best_model)


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


def check_federation_fields(config, client_weightings, round_schedules) -> None:
    """The federation's own fields, each with the fix named (``FederatedConfig.__post_init__``, after the kwargs
    are parsed and ``clients_per_round`` defaulted); their combinations are rows of the refusal table
    (fedhf/trainer/config/combinations/)."""
    checks = [
        (config.num_clients >= 1, "`num_clients` must be >= 1"),
        (config.clients_per_round >= 1, "`clients_per_round` must be >= 1"),
        (config.num_rounds >= 1, "`num_rounds` must be >= 1"),
        (config.local_steps >= 1, f"`local_steps` must be >= 1 (got {config.local_steps})"),
        (config.partition in PARTITIONERS, not_one_of("partition", config.partition, PARTITIONERS)),
        (config.dirichlet_alpha > 0,
         f"`dirichlet_alpha` must be > 0 (got {config.dirichlet_alpha}); 0.1 is strongly skewed, 100 nearly IID"),
        (config.min_partition_size >= 1, "`min_partition_size` must be >= 1: every client needs data"),
        (config.partition_max_retries >= 1, "`partition_max_retries` must be >= 1"),
        (config.partition_key in PARTITION_KEYS,
         not_one_of("partition_key", config.partition_key, PARTITION_KEYS)
         + " (or a callable passed as FederatedTrainer(partition_key=...))"),
        (config.partition_key_buckets >= 2, f"`partition_key_buckets` must be >= 2 (got {config.partition_key_buckets})"),
        (math.isfinite(config.quantity_skew) and config.quantity_skew >= 0,
         f"`quantity_skew` must be a finite number >= 0 (got {config.quantity_skew}); 0 = equal sizes, 1 = Zipf"),
        (0 <= config.client_eval_fraction < 1,
         f"`client_eval_fraction` must be in [0, 1) (got {config.client_eval_fraction}); e.g. 0.1"),
        (config.lora_client_ranks is None or (len(config.lora_client_ranks) == config.num_clients
                                            and all(int(r) >= 1 for r in config.lora_client_ranks)),
         f"`lora_client_ranks` needs one rank >= 1 per client ({config.num_clients}), got {config.lora_client_ranks}"),
        (config.client_weighting in client_weightings,
         not_one_of("client_weighting", config.client_weighting, client_weightings)),
        (config.round_lr_schedule in round_schedules,
         not_one_of("round_lr_schedule", config.round_lr_schedule, round_schedules)),
        (config.learning_rate is None or config.learning_rate > 0, "`learning_rate` must be > 0"),
        (config.weight_decay is None or config.weight_decay >= 0, "`weight_decay` must be >= 0"),
        (config.max_update_norm is None or config.max_update_norm > 0, "`max_update_norm` must be > 0 or unset"),
        (config.max_excluded_rounds >= 0, "`max_excluded_rounds` must be >= 0 (0 = never stop)"),
        (config.client_state_budget_mb is None or config.client_state_budget_mb >= 0,
         "`client_state_budget_mb` must be >= 0 or unset"),
        (config.eval_every_rounds >= 0, "`eval_every_rounds` must be >= 0"),
        (config.save_every_rounds >= 0, "`save_every_rounds` must be >= 0"),
        (config.gradient_accumulation_steps >= 1, "`gradient_accumulation_steps` must be >= 1"),
        (config.batched_clients >= 1, "`batched_clients` must be >= 1 (1 = one client at a time)"),
        (config.memory_budget_gb is None or config.memory_budget_gb > 0, "`memory_budget_gb` must be > 0 or unset"),
        (not config.average_tokens_across_devices,
         "`average_tokens_across_devices=True` would count other processes' tokens, which belong to other "
         "clients (local steps never all-reduce); leave it False"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message + ".")


def hub_is_offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "0").upper() in ("1", "ON", "YES", "TRUE")


def check_hub_access(args) -> None:
    """Before any work: ``push_to_hub=True`` needs the Hub (not offline) and a token. The token is never shown."""
    if not args.push_to_hub:
        return
    from huggingface_hub import get_token

    if hub_is_offline():
        raise ValueError("`push_to_hub=True` but the Hub is offline (HF_HUB_OFFLINE is set): set push_to_hub=False "
                         "to train offline (save_model() writes the card and weights locally), or unset "
                         "HF_HUB_OFFLINE.")
    if not (args.hub_token or get_token()):
        raise ValueError("`push_to_hub=True` but no Hugging Face token was found: set HF_TOKEN (or run `hf auth "
                         "login`, or pass `hub_token`), choose the repository with `hub_model_id`, or set "
                         "push_to_hub=False.")
