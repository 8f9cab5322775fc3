"""Server momentum, FedAvgM (Hsu et al., 2019, "Measuring the Effects of Non-Identical Data Distribution").

v <- beta v + mean_i Delta_i ; x^{r+1} = x^r + eta_g v, with v^0 = 0 (ALGORITHMS.md 2.2). Helps when client
updates are noisy and partial participation makes consecutive rounds disagree.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..params import TensorDict


def momentum_update(x: torch.Tensor, v: torch.Tensor, delta: torch.Tensor, lr: float, beta: float):
    v = beta * v + delta
    return x + lr * v, v


class ServerMomentum:
    name = "momentum"

    def __init__(self, lr: float = 1.0, beta: float = 0.9) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"`server_rule_kwargs.beta` must be in [0, 1), got {beta}.")
        self.lr, self.beta = float(lr), float(beta)

    def init(self, global_params: TensorDict) -> TensorDict:
        return {f"v.{n}": torch.zeros_like(t) for n, t in global_params.items()}

    def apply(self, x: TensorDict, mean_delta: TensorDict, state: TensorDict) -> Tuple[TensorDict, TensorDict]:
        new_x, new_state = {}, {}
        for n in x:
            new_x[n], new_state[f"v.{n}"] = momentum_update(x[n], state[f"v.{n}"], mean_delta[n], self.lr, self.beta)
        return new_x, new_state

    def __repr__(self) -> str:
        return f"ServerMomentum(lr={self.lr}, beta={self.beta})"
