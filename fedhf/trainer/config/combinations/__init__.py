"""Feature combinations fedhf refuses, in one table, checked before any work: the mechanism (refusal.py: the row,
what it reads, how rows are checked), the table's order and its checks (table.py), and the rows by concept
(federation, privacy, clock, sharing, compression, execution). A value check of one field stays where the field is
parsed (config_checks.py, the ``*_settings`` modules). docs/bad_inputs.md lists every refusal with the input that
triggers it (tests/trainer/bad_inputs.py)."""

from .refusal import SETTINGS, TRAINER, Refusal, Setup
from .table import COMBINATIONS, GROUPS, _refuse, check_combinations, check_setting_combinations

__all__ = ["SETTINGS", "TRAINER", "Refusal", "Setup", "COMBINATIONS", "GROUPS", "check_combinations",
           "check_setting_combinations"]
