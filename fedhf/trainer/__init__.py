"""The trainer: :class:`FederatedTrainer` and what it saves and publishes, here; by concept below it, config/ (its
:class:`FederatedConfig`, the Trainer-settings table, config checks, refused combinations), hooks/ (the round-hook
protocol and every round feature built as a hook) and runners/ (how a round's clients are trained, the memory plan).

Import rule: anything below it; nothing below imports it; its sub-folders' rules are in tests/test_layout.py.
"""

from .config.federated_config import FederatedConfig
from .federated_trainer import FederatedTrainer
from .hooks.base import ClientMessages, RoundHook

__all__ = ["ClientMessages", "FederatedConfig", "FederatedTrainer", "RoundHook"]
