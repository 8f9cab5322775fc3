"""Named algorithms: each is a short composition of one option per axis (see :mod:`fedhf.algorithm`).

``list_algorithms()`` names them all; ``get_algorithm(name, **kwargs)`` builds one. Defaults are the papers'
(ALGORITHMS.md section 2 gives the source of every number). ``lr`` is the peak learning rate of the cosine
schedule over rounds; ``FederatedConfig.learning_rate`` overrides it.
"""

from . import first_order, second_order  # noqa: F401  (they register their algorithms)
from .registry import ALGORITHMS, get_algorithm, list_algorithms

__all__ = ["ALGORITHMS", "get_algorithm", "list_algorithms"]
