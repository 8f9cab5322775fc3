"""The choice lists in FederatedConfig's field help: read from the registries, so a new component shows up in
``--help`` with its registry line."""

from __future__ import annotations

from typing import Iterable


def choice_list(names: Iterable[str]) -> str:
    """A registry's names as a help text's list (sorted, so the help is the same on every run)."""
    return ", ".join(sorted(names))
