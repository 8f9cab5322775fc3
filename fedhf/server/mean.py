"""The weighted mean of the client updates, and the plain server step: together FedAvg's server,
x^{r+1} = x^r + eta_g * mean_i Delta_i (McMahan et al., 2017)."""

from __future__ import annotations

from typing import Tuple

from ..core.context import ServerContext
from ..core.params import TensorDict
from .base import Aggregator, ServerTransform


class Mean(Aggregator):
    """D = sum_i w_i Delta_i / sum_i w_i (a sum: one all-reduce)."""

    name = "mean"

    def aggregate(self, ctx: ServerContext) -> TensorDict:
        return dict(ctx.mean_delta)


class Step(ServerTransform):
    """step = eta_g D."""

    name = "lr"

    def __init__(self, lr: float = 1.0) -> None:
        if lr <= 0:
            raise ValueError(f"`server_rule_kwargs.lr` must be > 0, got {lr}.")
        self.lr = float(lr)

    def step(self, direction: TensorDict, state: TensorDict, ctx: ServerContext) -> Tuple[TensorDict, TensorDict]:
        return {n: self.lr * d for n, d in direction.items()}, state
