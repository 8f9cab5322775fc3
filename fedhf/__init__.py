"""fedhf: federated fine-tuning as a first-class Hugging Face workflow.

Swap ``Trainer`` for :class:`FederatedTrainer` and ``TrainingArguments`` for :class:`FederatedConfig`.
"""

from . import algorithms
from .algorithms import Algorithm, compose, get_algorithm, list_algorithms
from .config import FederatedConfig
from .trainer import FederatedTrainer

__version__ = "0.1.0"


def __getattr__(name: str):
    # trl is optional: fedhf.FederatedSFTTrainer / FederatedSFTConfig import it on first use only.
    if name in ("FederatedSFTConfig", "FederatedSFTTrainer"):
        from . import trl

        return getattr(trl, name)
    raise AttributeError(f"module 'fedhf' has no attribute {name!r}")


__all__ = ["Algorithm", "FederatedConfig", "FederatedTrainer", "algorithms", "compose", "get_algorithm",
           "list_algorithms"]
