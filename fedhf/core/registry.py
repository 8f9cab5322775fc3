"""Explicit registries: a name maps to one factory, duplicates are refused, unknown names get the list and the
closest name (difflib)."""

from __future__ import annotations

import difflib
from typing import Callable, Dict, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, config_field: str) -> None:
        self.kind = kind  # e.g. "algorithm"; used in error messages
        self.config_field = config_field  # the FederatedConfig field a user sets, named in errors
        self._entries: Dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        key = name.lower() if isinstance(name, str) else name
        if key not in self._entries:
            close = difflib.get_close_matches(str(key), self._entries, n=1, cutoff=0.7)
            guess = f"Did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"Unknown {self.kind} {name!r} in `{self.config_field}`. {guess}"
                f"Choose one of: {', '.join(sorted(self._entries))}."
            )
        return self._entries[key]

    def names(self) -> list:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
