"""The trainer: :class:`FederatedTrainer`, its :class:`FederatedConfig`, the Trainer-settings table, config checks
and every round feature only the trainer calls (best round, exclusion guard, personalised evaluation, outputs,
execution modes, memory plan, Hub card).

Import rule: anything below it; nothing below imports it (tests/test_layout.py).
"""

from .config import FederatedConfig
from .federated_trainer import FederatedTrainer
from .hooks import ClientMessages, RoundHook

__all__ = ["ClientMessages", "FederatedConfig", "FederatedTrainer", "RoundHook"]
