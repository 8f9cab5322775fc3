"""The server axis, by name (the ``server_rule`` field of FederatedConfig): an aggregator and a chain of
transforms (:mod:`fedhf.server.base`).

``server_rule`` is either a named rule (``mean``, ``momentum``, ``adam``, ``yogi``, ``adagrad``, ``prefedopt``,
``preconditioned_mix``, ``median``, ``trimmed_mean``: the classic rules, each an aggregator plus one transform) or
a chain written ``"<aggregator>+<transform>+..."``, e.g. ``"median+momentum"`` or ``"mean+adam"``; a chain that
starts with a transform aggregates by the mean. ``server_rule_kwargs`` of a chain are handed to every part that
accepts them (so ``lr`` sets every transform's lr); a key no part accepts is refused.
"""

import inspect
from functools import partial
from typing import Any, Mapping, Optional

from ..core.registry import Registry
from .adaptive import AdaptiveServer
from .base import Aggregator, ServerRule, ServerTransform
from .covariance import CovarianceServer
from .lora import FedExLoRA, FedSVD, FLoRA, FlexLoRA
from .mean import Mean, Step
from .momentum import ServerMomentum
from .preconditioned_mix import PreconditionedMix
from .robust import RobustAggregator

AGGREGATORS: Registry = Registry("aggregator", "server_rule")
AGGREGATORS.register("mean")(Mean)
AGGREGATORS.register("preconditioned_mix")(PreconditionedMix)
AGGREGATORS.register("fedex_lora")(FedExLoRA)  # LoRA: exact product aggregation, residual folded into the base
AGGREGATORS.register("flora")(FLoRA)  # LoRA: stacking, merged into the base, fresh adapters
AGGREGATORS.register("flexlora")(FlexLoRA)  # LoRA: SVD of the mean product, re-factorised to rank r
AGGREGATORS.register("fedsvd")(FedSVD)  # LoRA: clients train B only; B A re-factorised, A orthonormal
for _kind in ("median", "trimmed_mean"):  # these gather the individual updates instead of summing them
    AGGREGATORS.register(_kind)(partial(RobustAggregator, _kind))

SERVER_TRANSFORMS: Registry = Registry("server transform", "server_rule")
SERVER_TRANSFORMS.register("lr")(Step)
SERVER_TRANSFORMS.register("momentum")(ServerMomentum)
for _kind in ("adam", "yogi", "adagrad"):
    SERVER_TRANSFORMS.register(_kind)(partial(AdaptiveServer, _kind))
SERVER_TRANSFORMS.register("prefedopt")(CovarianceServer)


def _named(aggregator: str, transform: str, aggregator_keys=()):
    """A classic named rule: ``aggregator`` + ``transform``, its kwargs split by who accepts them."""

    def build(**kwargs: Any) -> ServerRule:
        own = {k: kwargs.pop(k) for k in aggregator_keys if k in kwargs}
        return ServerRule(AGGREGATORS.get(aggregator)(**own), [SERVER_TRANSFORMS.get(transform)(**kwargs)],
                          name=transform if aggregator == "mean" and transform != "lr" else aggregator)

    return build


SERVER_RULES: Registry = Registry("server rule", "server_rule")
SERVER_RULES.register("mean")(_named("mean", "lr"))
for _kind in ("momentum", "adam", "yogi", "adagrad", "prefedopt"):
    SERVER_RULES.register(_kind)(_named("mean", _kind))
for _kind in ("fedex_lora", "flora", "flexlora", "fedsvd"):
    SERVER_RULES.register(_kind)(_named(_kind, "lr"))
SERVER_RULES.register("preconditioned_mix")(_named("preconditioned_mix", "lr", ("mix_lora",)))
for _kind in ("median", "trimmed_mean"):
    SERVER_RULES.register(_kind)(_named(_kind, "lr", ("trim_fraction",)))


def _accepted(factory) -> set:
    target = factory.func if isinstance(factory, partial) else factory
    return {n for n in inspect.signature(target).parameters if n not in ("self", "kind")}


def build_server_rule(name: str, kwargs: Optional[Mapping[str, Any]] = None) -> ServerRule:
    """A named rule, or a chain ``"<aggregator>+<transform>+..."`` (see the module docstring)."""
    kwargs = dict(kwargs or {})
    if "+" not in name:
        return SERVER_RULES.get(name)(**kwargs)
    parts = [p.strip().lower() for p in name.split("+")]
    aggregator = parts.pop(0) if parts[0] in AGGREGATORS else "mean"
    factories = [AGGREGATORS.get(aggregator)] + [SERVER_TRANSFORMS.get(p) for p in parts]
    unused = set(kwargs) - set().union(*(_accepted(f) for f in factories))
    if unused:
        raise TypeError(f"no part of the chain {name!r} accepts {sorted(unused)}")
    built = [f(**{k: v for k, v in kwargs.items() if k in _accepted(f)}) for f in factories]
    return ServerRule(built[0], built[1:], name=name)


__all__ = ["AGGREGATORS", "SERVER_RULES", "SERVER_TRANSFORMS", "AdaptiveServer", "Aggregator", "CovarianceServer",
           "FedExLoRA", "FedSVD", "FLoRA", "FlexLoRA",
           "Mean", "PreconditionedMix", "RobustAggregator", "ServerMomentum", "ServerRule", "ServerTransform", "Step",
           "build_server_rule"]
