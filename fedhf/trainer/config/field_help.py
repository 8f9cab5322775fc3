"""FederatedConfig's fields as a user meets them: the choice lists in their help (read from the registries, so a new
component shows up in ``--help`` with its registry line), and for ``fedhf train``, the overridable fields by group
(the class of FederatedConfig's bases that declares each) and the one-line refusal of a flag that is not a field,
with the closest names (difflib) or the recipe section it belongs to when it is a ``model:``/``data:`` key."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Dict, Iterable, List, Optional, Sequence


def choice_list(names: Iterable[str]) -> str:
    """A registry's names as a help text's list (sorted, so the help is the same on every run)."""
    return ", ".join(sorted(names))


DOCS = "docs/configuration.md (fields) and docs/trainer_settings.md (the TrainingArguments fields)"
# Names a Trainer or trl user types by habit -> the field that means it here.
HABITS = {"lr": "learning_rate", "rounds": "num_rounds", "clients": "num_clients", "epochs": "num_rounds"}
TRAINING_ARGUMENTS_TITLE = "TrainingArguments (honoured in rounds or refused)"


def field_groups() -> Dict[str, List[str]]:
    """Group title -> the init fields each class of FederatedConfig's bases declares, in declaration order: the
    federation's own, then one group per settings base (:meth:`FederatedConfig.settings_bases`, in the order
    dataclasses.fields() takes them), then TrainingArguments'. A settings base without a title fails here."""
    from transformers import TrainingArguments

    from .clock_settings import ClockSettings
    from .compression_settings import CompressionSettings
    from .federated_config import FederatedConfig
    from .partition_settings import PartitionSettings
    from .privacy_settings import PrivacySettings

    settings_titles = {PartitionSettings: "the data split", CompressionSettings: "compression",
                       PrivacySettings: "privacy", ClockSettings: "the simulated clock (docs/clock.md)"}
    titles = ((FederatedConfig, "the federation and its algorithm"),
              *((base, settings_titles[base]) for base in reversed(FederatedConfig.settings_bases())),
              (TrainingArguments, TRAINING_ARGUMENTS_TITLE))
    init = [f.name for f in dataclasses.fields(FederatedConfig) if f.init]
    # a TrainingArguments field FederatedConfig re-declares (a new default, e.g. logging_steps) is still Trainer's
    groups, seen = {}, set(vars(TrainingArguments).get("__annotations__", {}))
    for cls, title in titles:
        own = [n for n in init if n in vars(cls).get("__annotations__", {})
               and (n not in seen or cls is TrainingArguments)]
        seen.update(own)
        groups[title] = own
    groups[TRAINING_ARGUMENTS_TITLE] += [n for n in init if n not in seen]
    return groups


def fields_help(width: int = 100) -> str:
    """The ``fedhf train --help`` epilog: every overridable field by group, and where they are documented."""
    import textwrap

    lines = ["Overridable fields (--field value; a recipe's train: section holds the same names):"]
    for title, names in field_groups().items():
        lines.append(f"  {title}:")
        lines += textwrap.wrap(", ".join(names), width, initial_indent="    ", subsequent_indent="    ")
    lines.append(f"Fields are documented in {DOCS}; recipes in docs/recipes.md.")
    return "\n".join(lines)


def flag_names(overrides: Sequence[str]) -> List[str]:
    """The field names of ``--name value`` / ``--name=value`` tokens (a value that starts with -- is not read)."""
    names = []
    for token in overrides:
        if token.startswith("--"):
            names.append(token[2:].split("=", 1)[0].replace("-", "_"))
    return names


def unknown_flag_message(name: str, fields: Sequence[str], recipe_sections: Dict[str, Sequence[str]]) -> str:
    """The one-line refusal of ``--name``: the recipe section it belongs to, or the closest field names."""
    for section, keys in recipe_sections.items():
        if name in keys:
            return (f"--{name} is a key of the recipe's `{section}:` section, not a FederatedConfig field: set it in "
                    "the recipe (only train: fields can be given on the command line).")
    guesses = ([HABITS[name]] if name in HABITS else []) + difflib.get_close_matches(name, fields, n=3, cutoff=0.7)
    guesses = list(dict.fromkeys(guesses))
    hint = f" Did you mean {' or '.join('--' + g for g in guesses)}?" if guesses else ""
    return f"unknown option --{name}.{hint} `fedhf train --help` lists the fields."


def check_flags(overrides: Sequence[str], recipe_sections: Dict[str, Sequence[str]]) -> Optional[str]:
    """None when every ``--name`` is a field (``--no_name`` turns a boolean off, as HfArgumentParser reads it);
    otherwise the message for the first that is not. Exact names only: no argparse abbreviations."""
    from .federated_config import FederatedConfig

    fields = [f.name for f in dataclasses.fields(FederatedConfig) if f.init]
    known = set(fields)
    for name in flag_names(overrides):
        if name == "resume_from_checkpoint":
            return "--resume_from_checkpoint has no effect on `fedhf train`: use --resume (the newest checkpoint) " \
                   "or --resume PATH."
        if name not in known and not (name.startswith("no_") and name[3:] in known):
            return unknown_flag_message(name, fields, recipe_sections)
    return None
