"""The refusal mechanism: what a row reads (:class:`Setup`), the row (:class:`Refusal`) and how a list of rows is
checked (:func:`refuse`). The rows themselves are in this package's modules by concept; their order is table.py's.

Each :class:`Refusal` row says when a combination is refused (``when``), what the problem is and the fix, and what it
``needs`` to decide: the settings only (:data:`SETTINGS`: checked when the config is made, by
``FederatedConfig.__post_init__``, and again when the trainer is built, for a field changed since) or the trainer
(:data:`TRAINER`, the default: its algorithm, model, processes or loss, checked when the trainer is built). Rows of a
``group`` are gathered into one message, as one setting's problems (``batched_clients``, ``client_parallel``); a
row without a group is refused alone, the first in table order. A refusal that only a model helper can judge
(which LoRA layers can be stacked or merged into the base) is a row whose ``check`` raises with that helper's own
message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Union

from ....core.lora import LORA_A, LORA_B, role_of
from ....runtime.sharded import sharding_requested
from ....sharing.plan import SHARED

SETTINGS = "settings"  # the row reads the config's fields only (``s.args``)
TRAINER = "trainer"  # the row reads the built trainer: its algorithm, model, processes or loss


@dataclass
class Setup:
    """What the table reads: the trainer (its args, model, algorithm, sharing and roles, processes, loss), or before
    there is one, the settings alone (``settings``; a :data:`SETTINGS` row reads ``args`` only). ``trainer_class``
    is the trainer class whose ``compute_loss``/``training_step`` the shared pass reproduces, handed in by the
    trainer (FederatedTrainer): the table sits below the trainer and never imports it."""

    trainer: object
    settings: object = None
    trainer_class: Optional[type] = None

    @property
    def args(self):
        return self.settings if self.trainer is None else self.trainer.args

    def __getattr__(self, name):  # the trainer's attributes, read as the rows need them
        if name.startswith("__") or self.__dict__.get("trainer") is None:
            raise AttributeError(f"{name!r}: a row that reads the trainer must not declare needs=SETTINGS")
        return getattr(self.trainer, name)

    @property
    def rule(self):
        return self.trainer.algorithm.server_rule

    @property
    def needs_lora_pairs(self) -> bool:
        return self.rule.aggregator.needs_lora_pairs

    @property
    def shared(self) -> List[str]:
        return [n for n, r in self.trainer.sharing_roles.items() if r == SHARED]

    @property
    def lora(self) -> List[str]:
        return [n for n in self.trainer.sharing_roles if role_of(n) in (LORA_A, LORA_B)]


Text = Callable[[Setup], str]


@dataclass(frozen=True)
class Refusal:
    when: Callable[[Setup], bool]
    problem: Optional[Text] = None
    fix: Union[str, Text] = ""
    group: str = ""
    check: Optional[Callable[[Setup], None]] = None  # a model helper that raises its own message
    needs: str = TRAINER  # or SETTINGS: decided from the config's fields alone, when the config is made

    def message(self, s: Setup) -> str:
        fix = self.fix(s) if callable(self.fix) else self.fix
        return self.problem(s) + (f": {fix}" if fix else "") + "."


# what rows of several concepts ask
def batched(s: Setup) -> bool:
    return s.args.batched_clients > 1


def sharded(s: Setup) -> bool:
    return sharding_requested(s.args)


def refuse(s: Setup, rows: List[Refusal], groups: Dict[str, tuple]) -> None:
    """Raise the first refusal of ``rows`` that applies; a group's problems together, in one message, with the
    group's (head, fix) from ``groups``."""
    grouped: Dict[str, List[str]] = {}
    for row in rows:
        if row.group and grouped.get(row.group) is None:
            grouped[row.group] = []
        if not row.when(s):
            continue
        if row.check is not None:
            row.check(s)
        elif row.group:
            grouped[row.group].append(row.problem(s))
        else:
            raise ValueError(row.message(s))
    for group, problems in grouped.items():
        if problems:
            head, fix = groups[group]
            raise ValueError(head(s) + "; ".join(problems) + ". " + fix)
