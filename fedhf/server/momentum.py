"""Server momentum: FedAvgM (Hsu et al., 2019, "Measuring the Effects of Non-Identical Data Distribution") and its
Nesterov form, DiLoCo's outer optimizer (Douillard et al., 2023, "DiLoCo: Distributed Low-Communication Training of
Language Models").

Heavy ball: v <- beta v + D ; x^{r+1} = x^r + eta_g v, with v^0 = 0 (docs/algorithms.md 2.2, 2.16).
Nesterov:   v <- beta v + D ; x^{r+1} = x^r + eta_g (D + beta v), the look-ahead form of ``torch.optim.SGD(nesterov=
True)`` with D the negated outer gradient (DiLoCo's pseudo-gradient is x^r - mean_i x_i = -D).
Momentum helps when client updates are noisy and partial participation makes consecutive rounds disagree. D is
whatever the aggregator gives (the mean for FedAvgM; ``median+momentum`` for a robust variant).
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..core.context import ServerContext
from ..core.params import TensorDict
from .base import ServerTransform


class ServerMomentum(ServerTransform):
    name = "momentum"

    def __init__(self, lr: float = 1.0, beta: float = 0.9, nesterov: bool = False) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"`server_rule_kwargs.beta` must be in [0, 1), got {beta}.")
        if not isinstance(nesterov, bool):
            raise ValueError(f"`server_rule_kwargs.nesterov` must be true or false, got {nesterov!r}.")
        self.lr, self.beta, self.nesterov = float(lr), float(beta), nesterov

    def init(self, global_params: TensorDict) -> TensorDict:
        return {f"v.{n}": torch.zeros_like(t) for n, t in global_params.items()}

    def step(self, direction: TensorDict, state: TensorDict, ctx: ServerContext) -> Tuple[TensorDict, TensorDict]:
        step, new_state = {}, {}
        for n, d in direction.items():
            v = self.beta * state[f"v.{n}"] + d
            step[n], new_state[f"v.{n}"] = self.lr * (d + self.beta * v if self.nesterov else v), v
        return step, new_state
