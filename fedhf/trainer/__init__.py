"""The trainer: :class:`FederatedTrainer`, its :class:`FederatedConfig`, the Trainer-settings table, config checks
and every round feature only the trainer calls (best round, exclusion guard, personalised evaluation, outputs,
execution modes, memory plan, Hub card).

Import rule: anything below it; nothing below imports it (tests/test_layout.py).

The four names are imported on first use (PEP 562), so a module of this folder that needs no transformers (the
secure-aggregation check behind ``fedhf algorithms``, the field help) can be imported without loading it.
"""

from importlib import import_module

_EXPORTS = {"FederatedConfig": ".config", "FederatedTrainer": ".federated_trainer", "ClientMessages": ".hooks",
            "RoundHook": ".hooks"}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedhf.trainer' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])


__all__ = ["ClientMessages", "FederatedConfig", "FederatedTrainer", "RoundHook"]
