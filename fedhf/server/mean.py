"""The plain server rule: x^{r+1} = x^r + eta_g * mean_i Delta_i (FedAvg, McMahan et al., 2017)."""

from __future__ import annotations

from typing import Tuple

from ..params import TensorDict


class Mean:
    name = "mean"

    def __init__(self, lr: float = 1.0) -> None:
        if lr <= 0:
            raise ValueError(f"`server_rule_kwargs.lr` must be > 0, got {lr}.")
        self.lr = float(lr)

    def init(self, global_params: TensorDict) -> TensorDict:
        return {}

    def apply(self, x: TensorDict, mean_delta: TensorDict, state: TensorDict) -> Tuple[TensorDict, TensorDict]:
        return {n: x[n] + self.lr * mean_delta[n] for n in x}, state

    def __repr__(self) -> str:
        return f"Mean(lr={self.lr})"
