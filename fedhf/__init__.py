"""fedhf: federated fine-tuning as a first-class Hugging Face workflow.

Swap ``Trainer`` for :class:`FederatedTrainer` and ``TrainingArguments`` for :class:`FederatedConfig`.

The names below are imported on first use (PEP 562): ``import fedhf`` and the ``fedhf`` command's ``--help``,
``--version`` and ``algorithms`` stay free of transformers, peft and bitsandbytes, which take seconds to import.
"""

from importlib import import_module

from .runtime.library_notices import ignore_checkpointing_alias, silence_kernel_notice
from .version import __version__

silence_kernel_notice()  # before any fedhf module can import peft (and with it bitsandbytes)
ignore_checkpointing_alias()  # peft's read of a deprecated property, in the user's get_peft_model calls too

# public name -> the module that defines it (trl is optional: the SFT names import it on first use only)
_EXPORTS = {
    "Algorithm": ".algorithms", "compose": ".algorithms", "get_algorithm": ".algorithms",
    "list_algorithms": ".algorithms",
    "FederatedConfig": ".trainer", "FederatedTrainer": ".trainer", "ClientMessages": ".trainer",
    "RoundHook": ".trainer", "gather_over_processes": ".trainer", "sum_over_shards": ".trainer",
    "FederatedSFTConfig": ".trainer.sft", "FederatedSFTTrainer": ".trainer.sft",
}


def __getattr__(name: str):
    if name == "algorithms":
        return import_module(".algorithms", __name__)
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value  # the next look-up is an ordinary attribute
        return value
    raise AttributeError(f"module 'fedhf' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS, "algorithms"])


__all__ = ["Algorithm", "ClientMessages", "FederatedConfig", "FederatedTrainer", "RoundHook", "__version__",
           "algorithms", "compose", "gather_over_processes", "get_algorithm", "list_algorithms", "sum_over_shards"]
