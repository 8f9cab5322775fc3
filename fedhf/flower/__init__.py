"""Deploy what was simulated: fedhf's round on real Flower nodes (Flower 1.42's Message API).

``build_server_app(make_trainer)`` and ``build_client_app(make_trainer)`` turn the function that builds the
simulation's :class:`fedhf.FederatedTrainer` into a Flower ``ServerApp`` (fedhf's round loop, server halves and
server rule) and ``ClientApp`` (fedhf's client half on each node's clients). The same seeds, partitions and model give
the simulation's final model (tests/flower/test_parity.py). Commands, and what does not carry over:
docs/deployment.md.
"""

try:
    import flwr  # noqa: F401
except ImportError as error:  # an optional extra: the rest of fedhf never imports this package
    raise ImportError("fedhf.flower needs Flower: pip install 'fedhf[flower]' (flwr==1.42.0)") from error

from .clientapp import build_client_app, partition_ids
from .refusals import check_deployable, refusals
from .serverapp import RemoteClients, build_server_app, save_model

__all__ = ["build_client_app", "build_server_app", "check_deployable", "partition_ids", "refusals", "RemoteClients",
           "save_model"]
