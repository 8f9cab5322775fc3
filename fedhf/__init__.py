"""fedhf: federated fine-tuning as a first-class Hugging Face workflow.

Swap ``Trainer`` for :class:`FederatedTrainer` and ``TrainingArguments`` for :class:`FederatedConfig`.
"""

from . import algorithms
from .algorithm import Algorithm, compose
from .algorithms import get_algorithm, list_algorithms
from .config import FederatedConfig
from .trainer import FederatedTrainer

__version__ = "0.1.0"

__all__ = ["Algorithm", "FederatedConfig", "FederatedTrainer", "algorithms", "compose", "get_algorithm",
           "list_algorithms"]
