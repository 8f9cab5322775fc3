"""Local optimizers: how a client turns a gradient into a step.

A local optimizer is given by name (``"sgd"``, ``"adamw"``, or the name of any ``torch.optim`` class such as
``"RAdam"``) or as any ``torch.optim.Optimizer`` subclass, plus keyword arguments. It is built afresh for a
client's parameters at the start of each of its rounds (docs/algorithms.md section 2.1: optimizer state is reset
every round unless a state-sync rule says otherwise).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

import torch

from ..core.registry import Registry
from .base import FederatedOptimizer, ModelAccess, OptimizerHooks, TorchOptimizer
from .amsgrad import AMSGradNoBias
from .covariance import CovarianceAdam
from .foof import FOOF
from .muon import MuonAdamW
from .soap import SOAP
from .sophia import Sophia
from .state_size import TORCH_STATE_BYTES
from ..core.choices import closest

LOCAL_OPTIMIZERS: Registry[type] = Registry("local optimizer", "local_optimizer")
LOCAL_OPTIMIZERS.register("sgd")(torch.optim.SGD)  # coupled weight decay, docs/algorithms.md 1.1
LOCAL_OPTIMIZERS.register("adamw")(torch.optim.AdamW)  # docs/algorithms.md 1.2
LOCAL_OPTIMIZERS.register("muon")(MuonAdamW)  # docs/algorithms.md 1.3: Muon for matrices, AdamW for the rest
LOCAL_OPTIMIZERS.register("soap")(SOAP)  # 1.4
LOCAL_OPTIMIZERS.register("sophia")(Sophia)  # 1.5 (estimators gnb / hutchinson / empirical_fisher)
LOCAL_OPTIMIZERS.register("amsgrad")(AMSGradNoBias)  # 1.7 (amsgrad=False: Adam without bias correction)
LOCAL_OPTIMIZERS.register("covariance_adam")(CovarianceAdam)  # 1.8, PreFed's client
LOCAL_OPTIMIZERS.register("foof")(FOOF)  # 1.6, FedPM / LocalNewton


def resolve_optimizer_class(name_or_class: Union[str, type]) -> type:
    """A registered name, a ``torch.optim`` class name (any case), or an Optimizer subclass."""
    if inspect.isclass(name_or_class):
        if not issubclass(name_or_class, torch.optim.Optimizer):
            raise ValueError(
                f"`local_optimizer` must be a torch.optim.Optimizer subclass, got {name_or_class!r}."
            )
        return name_or_class
    if isinstance(name_or_class, str):
        if name_or_class.lower() in LOCAL_OPTIMIZERS:
            return LOCAL_OPTIMIZERS.get(name_or_class)
        by_lower = {
            n.lower(): c
            for n, c in vars(torch.optim).items()
            if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer
        }
        if name_or_class.lower() in by_lower:
            return by_lower[name_or_class.lower()]
        raise ValueError(
            f"Unknown local optimizer {name_or_class!r} in `local_optimizer`"
            f"{closest(name_or_class, [*LOCAL_OPTIMIZERS.names(), *(c.__name__ for c in by_lower.values())])}. "
            "Choose one of "
            f"{', '.join(LOCAL_OPTIMIZERS.names())}, any torch.optim class name "
            f"({', '.join(sorted(c.__name__ for c in by_lower.values()))}), or pass an Optimizer subclass."
        )
    raise ValueError(f"`local_optimizer` must be a name or an Optimizer class, got {name_or_class!r}.")


@dataclass(frozen=True)
class LocalOptimizer:
    """Which optimizer a client runs, with its keyword arguments (``lr`` is the peak round learning rate)."""

    optimizer: Union[str, type] = "sgd"
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cls = resolve_optimizer_class(self.optimizer)
        object.__setattr__(self, "_cls", cls)  # resolved once; build() runs for every client round
        accepted = inspect.signature(cls.__init__).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
            unknown = sorted(set(self.kwargs) - set(accepted))
            if unknown:
                raise ValueError(
                    f"{cls.__name__} does not accept {unknown} (from `local_optimizer_kwargs` or the algorithm). "
                    f"It accepts: {', '.join(k for k in accepted if k not in ('self', 'params'))}."
                )
        self._probe()

    def _probe(self) -> None:
        """Build once on a dummy matrix, so a bad value (an unknown estimator, a negative beta) is refused when the
        config is built, not at the first client of the first round."""
        try:
            self.build({"probe.weight": torch.nn.Parameter(torch.zeros(2, 2))}, self.lr)
        except (ValueError, TypeError) as err:
            raise ValueError(f"Bad `local_optimizer_kwargs` for {self.cls.__name__}: {err}") from None

    @property
    def cls(self) -> type:
        return self._cls

    @property
    def lr(self) -> float:
        """The configured peak lr, else the optimizer class's own default."""
        if "lr" in self.kwargs:
            return float(self.kwargs["lr"])
        default = inspect.signature(self.cls.__init__).parameters.get("lr")
        if default is None or not isinstance(default.default, (int, float)):
            raise ValueError(f"{self.cls.__name__} has no default lr; set `learning_rate`.")
        return float(default.default)

    def with_overrides(self, **overrides: Any) -> "LocalOptimizer":
        kept = {k: v for k, v in overrides.items() if v is not None}
        return LocalOptimizer(self.optimizer, {**self.kwargs, **kept})

    @property
    def federated(self) -> bool:
        """One of fedhf's own optimizers (named parameters, a Theta that can be warm-started)."""
        return issubclass(self.cls, FederatedOptimizer)

    @property
    def imports_theta(self) -> bool:
        """Whether its Theta can be warm-started (fedhf's own optimizers); torch.optim ones can only export."""
        return self.federated and self.cls.imports_theta

    @property
    def exports_preconditioners(self) -> bool:
        return self.federated and self.cls.exports_preconditioners

    @property
    def logits_pass(self) -> Optional[str]:
        """How a client's curvature pass runs every position's logits: "backward", "no_grad" or None
        (:meth:`FederatedOptimizer.logits_pass`)."""
        return self.cls.logits_pass(**self.kwargs) if self.federated else None

    @property
    def unplanned_memory(self) -> Optional[str]:
        """What its memory the plan cannot count (a note in the plan), or None."""
        return self.cls.unplanned_memory(**self.kwargs) if self.federated else None

    def state_bytes(self, params: Mapping[str, torch.Tensor]) -> Optional[int]:
        """The declared bytes of one client's optimizer state for ``params``; None for a torch.optim class that
        fedhf has no declaration for (fedhf/optim/state_size.py lists those it has)."""
        if self.federated:
            return self.cls.state_bytes(params, **self.kwargs)
        declared = TORCH_STATE_BYTES.get(self.cls)
        return None if declared is None else declared(params, self.kwargs)

    def build(self, params: Dict[str, torch.nn.Parameter], lr: float) -> OptimizerHooks:
        """The optimizer for one client round, behind the :class:`OptimizerHooks` protocol."""
        kwargs = {**self.kwargs, "lr": lr}
        if self.federated:
            return self.cls(list(params.items()), **kwargs)
        return TorchOptimizer(self.cls(list(params.values()), **kwargs), {p: name for name, p in params.items()},
                              TORCH_THETA_KEYS.get(self.cls, ()))


#: Theta of torch.optim classes, exported for the drift metric only (docs/algorithms.md 2.15: AdamW -> v).
TORCH_THETA_KEYS = {torch.optim.AdamW: ("exp_avg_sq",), torch.optim.Adam: ("exp_avg_sq",)}


__all__ = ["FOOF", "LOCAL_OPTIMIZERS", "SOAP", "AMSGradNoBias", "CovarianceAdam", "FederatedOptimizer", "LocalOptimizer",
           "ModelAccess", "MuonAdamW", "OptimizerHooks", "Sophia", "TorchOptimizer", "resolve_optimizer_class"]
