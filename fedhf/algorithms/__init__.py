"""Algorithms: :class:`Algorithm` (one option per axis), :func:`compose`, and the named ones.

``list_algorithms()`` names them all; ``get_algorithm(name, **kwargs)`` builds one. Defaults are the papers'
(docs/algorithms.md section 2 gives the source of every number). ``lr`` is the peak learning rate of the cosine
schedule over rounds; ``FederatedConfig.learning_rate`` overrides it.
"""

from .compose import ALGORITHMS, Algorithm, compose, get_algorithm, list_algorithms
from . import first_order, outer_nesterov, second_order  # noqa: F401,E402  (they register their algorithms)

__all__ = ["ALGORITHMS", "Algorithm", "compose", "get_algorithm", "list_algorithms"]
