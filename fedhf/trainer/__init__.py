"""The trainer: :class:`FederatedTrainer` and what it saves and publishes, here; by concept below it, config/ (its
:class:`FederatedConfig`, the Trainer-settings table, config checks, refused combinations), hooks/ (the round-hook
protocol and every round feature built as a hook) and runners/ (how a round's clients are trained, the memory plan).

Import rule: anything below it; nothing below imports it; its sub-folders' rules are in tests/test_layout.py.

The names are imported on first use (PEP 562), so a module below it that needs no transformers (the fields'
help behind ``fedhf train --help``) can be imported without loading it.
"""

from importlib import import_module

_EXPORTS = {"FederatedConfig": ".config.federated_config", "FederatedTrainer": ".federated_trainer",
            "ClientMessages": ".hooks.base", "RoundHook": ".hooks.base",
            "gather_over_processes": ".hooks.process_totals", "sum_over_shards": ".hooks.process_totals"}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedhf.trainer' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])


__all__ = ["ClientMessages", "FederatedConfig", "FederatedTrainer", "RoundHook", "gather_over_processes",
           "sum_over_shards"]
