"""An algorithm is a composition of four orthogonal choices (docs/algorithms.md section 4):

* ``local_optimizer`` -- the optimizer a client runs (:class:`fedhf.optim.LocalOptimizer`);
* ``state_sync`` -- what happens to the optimizer's state Theta between rounds (:mod:`fedhf.sync`: reset,
  persist_local, average_warmstart, compressed_average, desloc);
* ``correction`` -- how the local step is steered toward the global one (:mod:`fedhf.corrections`);
* ``server_rule`` -- how the summed client results become the next global model (:mod:`fedhf.server`).

The field names are the config's: one vocabulary for the axes in code, config and docs. Named algorithms
(first_order.py, second_order.py) are short functions registered in ``ALGORITHMS`` that pick one option per axis;
:func:`compose` swaps any axis from :class:`FederatedConfig` (``local_optimizer``, ``correction``, ``server_rule``,
``state_sync`` and their ``*_kwargs``) to build combinations no paper tried.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Union

from ..corrections import CORRECTIONS, Correction
from ..optim import LocalOptimizer
from ..core.registry import Registry
from ..server import Mean, ServerRule, Step, build_server_rule
from ..sync import STATE_SYNCS, Reset, StateSync


def _fedavg_server() -> ServerRule:
    return ServerRule(Mean(), [Step()])


@dataclass(frozen=True)
class Algorithm:
    name: str
    local_optimizer: LocalOptimizer
    correction: Correction = field(default_factory=Correction)
    server_rule: ServerRule = field(default_factory=_fedavg_server)
    state_sync: StateSync = field(default_factory=Reset)

    def __post_init__(self) -> None:
        optimizer = self.local_optimizer
        if self.state_sync.imports_theta and not optimizer.imports_theta:
            raise ValueError(
                f"State sync {self.state_sync.name!r} warm-starts the optimizer state, which {optimizer.cls.__name__} "
                "cannot import: choose a fedhf local optimizer (sgd/adamw from torch only export it) or "
                "`state_sync='reset'`.")
        check_basis_stable_state(self)
        if self.server_rule.aggregator.needs_preconditioners and not optimizer.exports_preconditioners:
            raise ValueError(f"Server rule {self.server_rule.name!r} needs the local optimizer FOOF (one that exports "
                             f"preconditioners), got {optimizer.cls.__name__}: "
                             "set `local_optimizer=\"foof\"` accordingly.")

    def describe(self) -> str:
        optimizer = self.local_optimizer
        return (f"{self.name}: local_optimizer={optimizer.cls.__name__}({dict(optimizer.kwargs)}), "
                f"state_sync={self.state_sync!r}, correction={self.correction!r}, server_rule={self.server_rule!r}")


def check_basis_stable_state(algorithm: Algorithm) -> None:
    """A rule that re-factorises LoRA every round (FlexLoRA, FedSVD, FLoRA) keeps the product B A but not A and B:
    FlexLoRA's SVD may reorder and flip components, FedSVD rotates them, FLoRA restarts the adapter. State kept per
    entry of A and B across rounds -- a correction's c / g_G / y, an optimizer's Theta warm-started or persisted --
    was measured in the old basis and would act in the new one. Adam-family Theta is elementwise and cannot be
    rotated at all, so these combinations are refused rather than transformed."""
    rule = algorithm.server_rule
    if not rule.aggregator.refactorises_lora:
        return
    if algorithm.correction.carries_state:
        raise ValueError(
            f"`server_rule={rule.name!r}` rebuilds LoRA A and B in a new basis every round, but the correction "
            f"{algorithm.correction.name!r} keeps state for A and B from round to round, which would be applied in "
            "the old basis. Use server_rule='fedex_lora' (it keeps the averaged A and B) or a stateless correction "
            "(`correction='none'` or 'proximal').")
    if algorithm.state_sync.carries_state:
        raise ValueError(
            f"`server_rule={rule.name!r}` rebuilds LoRA A and B in a new basis every round, but `state_sync="
            f"{algorithm.state_sync.name!r}` carries the optimizer state of A and B into the next round, where it "
            "would act in the old basis. Use `state_sync='reset'` or server_rule='fedex_lora'.")


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


def _build(registry, name: str, kwargs: Optional[Mapping[str, Any]], field_name: str):
    factory = registry.get(name)
    try:
        return factory(**dict(kwargs or {}))
    except TypeError as err:
        raise ValueError(f"Bad `{field_name}` for {registry.kind} {name!r}: {err}.") from None


def compose(
    algorithm: Union[str, Algorithm] = "fedavg",
    algorithm_kwargs: Optional[Mapping[str, Any]] = None,
    *,
    local_optimizer: Union[str, type, None] = None,
    local_optimizer_kwargs: Optional[Mapping[str, Any]] = None,
    correction: Optional[str] = None,
    correction_kwargs: Optional[Mapping[str, Any]] = None,
    server_rule: Optional[str] = None,
    server_rule_kwargs: Optional[Mapping[str, Any]] = None,
    state_sync: Optional[str] = None,
    state_sync_kwargs: Optional[Mapping[str, Any]] = None,
    learning_rate: Optional[float] = None,
    weight_decay: Optional[float] = None,
) -> Algorithm:
    """A named algorithm (or an :class:`Algorithm`) with any of its axes replaced.

    ``learning_rate``/``weight_decay`` (from the config) override the algorithm's paper defaults when given.
    """
    algo = algorithm if isinstance(algorithm, Algorithm) else get_algorithm(algorithm, **dict(algorithm_kwargs or {}))
    optimizer = algo.local_optimizer
    if local_optimizer is not None:
        # A different optimizer does not inherit the algorithm's lr (SGD's 0.1 would wreck AdamW): its own
        # default applies unless `learning_rate` or `local_optimizer_kwargs` say otherwise.
        optimizer = LocalOptimizer(local_optimizer, dict(local_optimizer_kwargs or {}))
    elif local_optimizer_kwargs:
        optimizer = optimizer.with_overrides(**local_optimizer_kwargs)
    optimizer = optimizer.with_overrides(lr=learning_rate, weight_decay=weight_decay)
    changes = {"local_optimizer": optimizer}
    replaced = [f"local_optimizer={local_optimizer}"] if local_optimizer is not None else []
    if correction is not None:
        changes["correction"] = _build(CORRECTIONS, correction, correction_kwargs, "correction_kwargs")
        replaced.append(f"correction={correction}")
    elif correction_kwargs:
        raise ValueError("`correction_kwargs` was given without `correction`; name the correction it configures.")
    if server_rule is not None:
        try:
            changes["server_rule"] = build_server_rule(server_rule, server_rule_kwargs)
        except TypeError as err:
            raise ValueError(f"Bad `server_rule_kwargs` for server rule {server_rule!r}: {err}.") from None
        replaced.append(f"server_rule={server_rule}")
    elif server_rule_kwargs:
        raise ValueError("`server_rule_kwargs` was given without `server_rule`; name the rule it configures.")
    if state_sync is not None and state_sync == algo.state_sync.name and not state_sync_kwargs:
        pass  # the algorithm's own rule, with its own settings (DiLoCo's persist_local keeps the whole state)
    elif state_sync is not None:
        changes["state_sync"] = _build(STATE_SYNCS, state_sync, state_sync_kwargs, "state_sync_kwargs")
        replaced.append(f"state_sync={state_sync}")
    elif state_sync_kwargs:
        raise ValueError("`state_sync_kwargs` was given without `state_sync`; name the rule it configures.")
    if replaced:
        changes["name"] = f"{algo.name}[{','.join(replaced)}]"
    return replace(algo, **changes)
