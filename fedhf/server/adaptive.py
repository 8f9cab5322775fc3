"""Adaptive server optimizers FedAdagrad, FedYogi, FedAdam (Reddi et al., 2021, "Adaptive Federated
Optimization", Algorithm 2).

With D the aggregated direction (the mean for FedOpt; docs/algorithms.md 2.6):
    m <- b1 m + (1 - b1) D
    adagrad: v <- v + D^2 ;  yogi: v <- v - (1 - b2) D^2 sign(v - D^2) ;  adam: v <- b2 v + (1 - b2) D^2
    x <- x + eta_g m / (sqrt(v) + tau)
No bias correction; m^0 = 0 and v^0 = tau^2. Defaults b1 0.9, b2 0.99, tau 1e-3 (FedPM App. C.3, PreFed sec. 6).
The moments are those of the local AMSGrad (:func:`fedhf.core.updates.adaptive_moments_`, one function for both).
Useful when the pseudo-gradient scale differs a lot between coordinates (e.g. LoRA B vs A, the head).
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..core.context import ServerContext
from ..core.params import TensorDict
from ..core.updates import SECOND_MOMENTS, adaptive_moments_
from .base import ServerTransform

KINDS = SECOND_MOMENTS


class AdaptiveServer(ServerTransform):
    def __init__(self, kind: str, lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3):
        if kind not in KINDS:
            raise ValueError(f"Unknown adaptive server rule {kind!r}; choose one of {KINDS}.")
        if tau <= 0:
            raise ValueError(f"`server_rule_kwargs.tau` must be > 0, got {tau}.")
        self.name = kind
        self.kind, self.lr, self.beta1, self.beta2, self.tau = kind, float(lr), float(beta1), float(beta2), float(tau)

    def init(self, global_params: TensorDict) -> TensorDict:
        state = {}
        for n, t in global_params.items():
            state[f"m.{n}"] = torch.zeros_like(t)
            state[f"v.{n}"] = torch.full_like(t, self.tau**2)
        return state

    def step(self, direction: TensorDict, state: TensorDict, ctx: ServerContext) -> Tuple[TensorDict, TensorDict]:
        step, new_state = {}, {}
        for n, d in direction.items():
            m, v = state[f"m.{n}"].clone(), state[f"v.{n}"].clone()
            adaptive_moments_(d, m, v, self.beta1, self.beta2, self.kind)
            step[n], new_state[f"m.{n}"], new_state[f"v.{n}"] = self.lr * m / (v.sqrt() + self.tau), m, v
        return step, new_state
