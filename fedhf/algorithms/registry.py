"""The registry of named algorithms."""

from __future__ import annotations

import inspect
from typing import Callable

from ..algorithm import Algorithm
from ..registry import Registry

ALGORITHMS: Registry[Callable[..., Algorithm]] = Registry("algorithm", "algorithm")


def list_algorithms() -> list:
    return ALGORITHMS.names()


def get_algorithm(name: str, **kwargs) -> Algorithm:
    factory = ALGORITHMS.get(name)
    try:
        return factory(**kwargs)
    except TypeError as err:
        accepted = sorted(inspect.signature(factory).parameters)
        raise ValueError(f"Bad `algorithm_kwargs` for algorithm {name!r}: {err}; it accepts {accepted}.") from None
