"""Server momentum, FedAvgM (Hsu et al., 2019, "Measuring the Effects of Non-Identical Data Distribution").

v <- beta v + D ; x^{r+1} = x^r + eta_g v, with v^0 = 0 (docs/algorithms.md 2.2). Helps when client updates are noisy
and partial participation makes consecutive rounds disagree. D is whatever the aggregator gives (the mean for
FedAvgM; ``median+momentum`` for a robust variant).
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..core.context import ServerContext
from ..core.params import TensorDict
from .base import ServerTransform


class ServerMomentum(ServerTransform):
    name = "momentum"

    def __init__(self, lr: float = 1.0, beta: float = 0.9) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"`server_rule_kwargs.beta` must be in [0, 1), got {beta}.")
        self.lr, self.beta = float(lr), float(beta)

    def init(self, global_params: TensorDict) -> TensorDict:
        return {f"v.{n}": torch.zeros_like(t) for n, t in global_params.items()}

    def step(self, direction: TensorDict, state: TensorDict, ctx: ServerContext) -> Tuple[TensorDict, TensorDict]:
        step, new_state = {}, {}
        for n, d in direction.items():
            v = self.beta * state[f"v.{n}"] + d
            step[n], new_state[f"v.{n}"] = self.lr * v, v
        return step, new_state
