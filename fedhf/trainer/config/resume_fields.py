"""Which config fields a checkpoint's fingerprint holds: a run resumed from the checkpoint must match them
(fedhf/state/run.py, ``check_fingerprint``), else its rounds would continue a different run.

Every field of the settings groups FederatedConfig is composed of (its ``*_settings`` bases) is fingerprinted unless
:data:`RESUMABLE` names it with the reason it may change: a field added to a group is covered without anyone
remembering this list. FederatedConfig's own fields and TrainingArguments' are many, and most (logging, saving,
evaluation cadence, paths, memory budgets) may change on resume: those that decide the rounds' results are named in
:data:`RUN_FIELDS`; the algorithm is fingerprinted as built (``algorithm.describe()``, fedhf/state/run.py).
"""

from __future__ import annotations

import dataclasses
from typing import List, Tuple

from transformers import TrainingArguments

#: Settings-group fields a resumed run may change, and why: none changes what an earlier or a later round computes.
RESUMABLE = {
    "clock_budget_s": "when the run stops (the simulated time reached), not what a round computes; resume to go on",
    "dp_stop_at_budget": "whether the run stops before the privacy budget is spent, not what a round computes",
    "partition_max_retries": "a cap on the Dirichlet split's redraws: a split drawn within both caps is the same",
    "partition_report": "whether partition.json/png are written, nothing the rounds read",
}

#: FederatedConfig's own and TrainingArguments' fields that decide the rounds' results.
RUN_FIELDS = ("num_clients", "clients_per_round", "num_rounds", "local_steps", "seed", "client_weighting",
              "round_lr_schedule", "per_device_train_batch_size", "max_grad_norm", "parameter_sharing",
              "parameter_sharing_kwargs", "lora_client_ranks", "gradient_accumulation_steps", "batched_clients",
              "bf16", "fp16", "metric_for_best_model", "greater_is_better", "load_best_model_at_end",
              "max_update_norm")


def settings_bases(config_class: type) -> List[type]:
    """The settings groups ``config_class`` (FederatedConfig or a subclass) is composed of: the dataclasses of its
    MRO that are not TrainingArguments (in declaration order). Read from the MRO, not ``__bases__``: a subclass's
    bases are FederatedConfig itself (and trl's SFTConfig for FederatedSFTConfig), whose every TrainingArguments
    field would otherwise be fingerprinted (output_dir, logging, hub_token: a resume refused, or meta.json unwritable
    for AcceleratorConfig)."""
    return [base for base in config_class.__mro__
            if dataclasses.is_dataclass(base) and not issubclass(base, TrainingArguments)]


def fingerprint_fields(config_class: type) -> Tuple[str, ...]:
    """:data:`RUN_FIELDS` and every settings group's field but the :data:`RESUMABLE` ones."""
    grouped = tuple(f.name for base in settings_bases(config_class) for f in dataclasses.fields(base)
                    if f.name not in RESUMABLE)
    return RUN_FIELDS + grouped
