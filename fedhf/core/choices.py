"""The message for a value that is not one of a field's choices: the choices, the value, and the closest choice
(difflib, as the command line does for a mistyped flag), so `deadlin` gets "did you mean 'deadline'?"."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(value, choices: Iterable) -> str:
    """" (did you mean 'x'?)" for the closest choice, or "" when none is close."""
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def not_one_of(field: str, value, choices: Iterable) -> str:
    """"`field` must be one of (...), got 'value' (did you mean ...?)" (no final period: the checks add it)."""
    choices = tuple(choices)
    return f"`{field}` must be one of {choices}, got {value!r}{closest(value, choices)}"
