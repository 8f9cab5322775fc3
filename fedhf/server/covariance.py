"""PreFedOpt: the covariance preconditioner on the server (Tao et al., AISTATS 2022, "Preconditioned Federated
Learning", Algorithm 3; docs/algorithms.md 2.14).

Clients run plain local SGD; the server treats the per-step average model change as its gradient signal::

    D = mean_i Delta_i / K                    (per local step; K the nominal local steps)
    m <- b1 m + (1 - b1) D
    P <- b2 P + (1 - b2) (D - m)*(D - m)      (with the updated m)
    x <- x + eta D / sqrt(P + tau)

m^0 = P^0 = 0. Two typos of the paper's listing are fixed (docs/algorithms.md 5.12): its m update reads
"(b1 - 1)(D_t - m_{t-1})", taken as the usual EMA, and its "-" before eta would ascend since Delta = w_K - w_t,
so the step is "+". The numerator is D, not m, as written (the SDProp form): m only centres the variance.
The moments are the local PreFed optimizer's (:func:`fedhf.core.updates.covariance_moments_`, one function for both).
Defaults: eta 0.05 (the server step of the experiments, sec. 6; the Alg. 3 header says 0.002), b1 = b2 = 0.9
(experiments), tau 1e-3.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..core.context import ServerContext
from ..core.params import TensorDict
from ..core.updates import covariance_moments_
from .base import ServerTransform


class CovarianceServer(ServerTransform):
    name = "prefedopt"

    def __init__(self, lr: float = 0.05, beta1: float = 0.9, beta2: float = 0.9, tau: float = 1e-3) -> None:
        if lr <= 0:
            raise ValueError(f"`server_rule_kwargs.lr` must be > 0, got {lr}.")
        if tau <= 0:
            raise ValueError(f"`server_rule_kwargs.tau` must be > 0, got {tau}.")
        for key, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"`server_rule_kwargs.{key}` must be in [0, 1), got {beta}.")
        self.lr, self.beta1, self.beta2, self.tau = float(lr), float(beta1), float(beta2), float(tau)

    def init(self, global_params: TensorDict) -> TensorDict:
        state = {}
        for n, t in global_params.items():
            state[f"m.{n}"] = torch.zeros_like(t)
            state[f"P.{n}"] = torch.zeros_like(t)
        return state

    def step(self, direction: TensorDict, state: TensorDict, ctx: ServerContext) -> Tuple[TensorDict, TensorDict]:
        if ctx.local_steps < 1:
            raise ValueError("PreFedOpt divides by the round's local steps: the ServerContext needs local_steps >= 1.")
        step, new_state = {}, {}
        for n, d in direction.items():
            D = d / ctx.local_steps
            m, P = state[f"m.{n}"].clone(), state[f"P.{n}"].clone()
            covariance_moments_(D, m, P, self.beta1, self.beta2)
            step[n], new_state[f"m.{n}"], new_state[f"P.{n}"] = self.lr * D / (P + self.tau).sqrt(), m, P
        return step, new_state
