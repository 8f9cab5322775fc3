"""The refusal table: every row of this package's modules, in the order they are tried, and its two checks.

The first refusal that applies is raised (a group's problems together), so the order is part of the behaviour: a
config with two problems hears of the same one first. A concept's rows may therefore sit in two places (its
settings among themselves early, what it cannot run with later).
"""

from __future__ import annotations

from typing import List

from . import clock, compression, execution, federation, privacy, sharing
from .refusal import SETTINGS, Refusal, Setup, refuse

COMBINATIONS: List[Refusal] = [
    *federation.FIELDS,
    *privacy.FIELDS,
    *clock.FIELDS,
    *execution.ACCUMULATION,
    *clock.WITH_THE_TRAINER,
    *privacy.WITH_FEATURES,
    *federation.WITH_PROCESSES,
    *sharing.ROWS,
    *compression.ROWS,
    *execution.ROWS,
]
GROUPS = execution.GROUPS


def check_setting_combinations(args) -> None:
    """Raise the first refusal of the rows that need the settings only (``FederatedConfig.__post_init__``)."""
    _refuse(Setup(None, args), [row for row in COMBINATIONS if row.needs == SETTINGS])


def check_combinations(trainer, trainer_class: type) -> None:
    """Raise the first refusal of the table that applies (a group's problems together, in one message), every row
    (the settings' ones again: a field may have changed since the config was made). ``trainer_class`` is the
    trainer class whose loss methods the shared pass reproduces (FederatedTrainer hands itself in)."""
    _refuse(Setup(trainer, trainer_class=trainer_class), COMBINATIONS)


def _refuse(s: Setup, rows: List[Refusal]) -> None:
    refuse(s, rows, GROUPS)
