"""Server rules, by name (the ``server_rule`` field of FederatedConfig)."""

from functools import partial

from ..registry import Registry
from .adaptive import AdaptiveServer
from .covariance import CovarianceServer
from .mean import Mean
from .momentum import ServerMomentum
from .preconditioned_mix import PreconditionedMix
from .robust import RobustAggregator

SERVER_RULES: Registry = Registry("server rule", "server_rule")
SERVER_RULES.register("mean")(Mean)
SERVER_RULES.register("momentum")(ServerMomentum)
for _kind in ("adam", "yogi", "adagrad"):
    SERVER_RULES.register(_kind)(partial(AdaptiveServer, _kind))
SERVER_RULES.register("prefedopt")(CovarianceServer)
SERVER_RULES.register("preconditioned_mix")(PreconditionedMix)
for _kind in ("median", "trimmed_mean"):  # these gather the individual updates instead of summing them
    SERVER_RULES.register(_kind)(partial(RobustAggregator, _kind))

__all__ = ["SERVER_RULES", "AdaptiveServer", "CovarianceServer", "Mean", "PreconditionedMix", "RobustAggregator", "ServerMomentum"]
