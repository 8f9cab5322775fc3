"""fedhf: federated fine-tuning as a first-class Hugging Face workflow.

Swap ``Trainer`` for :class:`FederatedTrainer` and ``TrainingArguments`` for :class:`FederatedConfig`.
"""

from . import algorithms
from .algorithms import Algorithm, compose, get_algorithm, list_algorithms
from .trainer import ClientMessages, FederatedConfig, FederatedTrainer, RoundHook
from .version import __version__


def __getattr__(name: str):
    # trl is optional: fedhf.FederatedSFTTrainer / FederatedSFTConfig import it on first use only.
    if name in ("FederatedSFTConfig", "FederatedSFTTrainer"):
        from .trainer import sft as trl

        return getattr(trl, name)
    raise AttributeError(f"module 'fedhf' has no attribute {name!r}")


__all__ = ["Algorithm", "ClientMessages", "FederatedConfig", "FederatedTrainer", "RoundHook", "algorithms", "compose",
           "get_algorithm", "list_algorithms"]
