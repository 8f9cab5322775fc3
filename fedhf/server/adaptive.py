"""Adaptive server optimizers FedAdagrad, FedYogi, FedAdam (Reddi et al., 2021, "Adaptive Federated
Optimization", Algorithm 2).

With D = mean_i Delta_i (ALGORITHMS.md 2.6):
    m <- b1 m + (1 - b1) D
    adagrad: v <- v + D^2 ;  yogi: v <- v - (1 - b2) D^2 sign(v - D^2) ;  adam: v <- b2 v + (1 - b2) D^2
    x <- x + eta_g m / (sqrt(v) + tau)
No bias correction; m^0 = 0 and v^0 = tau^2. Defaults b1 0.9, b2 0.99, tau 1e-3 (FedPM App. C.3, PreFed sec. 6).
Useful when the pseudo-gradient scale differs a lot between coordinates (e.g. LoRA B vs A, the head).
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..params import TensorDict

KINDS = ("adagrad", "yogi", "adam")


def second_moment_update(v: torch.Tensor, delta: torch.Tensor, kind: str, beta2: float) -> torch.Tensor:
    sq = delta * delta
    if kind == "adagrad":
        return v + sq
    if kind == "yogi":
        return v - (1 - beta2) * sq * torch.sign(v - sq)
    if kind == "adam":
        return beta2 * v + (1 - beta2) * sq
    raise ValueError(f"Unknown adaptive server rule {kind!r}; choose one of {KINDS}.")


def adaptive_update(x, m, v, delta, *, kind: str, lr: float, beta1: float, beta2: float, tau: float):
    m = beta1 * m + (1 - beta1) * delta
    v = second_moment_update(v, delta, kind, beta2)
    return x + lr * m / (v.sqrt() + tau), m, v


class AdaptiveServer:
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

    def apply(self, x: TensorDict, mean_delta: TensorDict, state: TensorDict) -> Tuple[TensorDict, TensorDict]:
        new_x, new_state = {}, {}
        for n in x:
            new_x[n], new_state[f"m.{n}"], new_state[f"v.{n}"] = adaptive_update(
                x[n], state[f"m.{n}"], state[f"v.{n}"], mean_delta[n],
                kind=self.kind, lr=self.lr, beta1=self.beta1, beta2=self.beta2, tau=self.tau,
            )
        return new_x, new_state

    def __repr__(self) -> str:
        return (f"AdaptiveServer(kind={self.kind!r}, lr={self.lr}, beta1={self.beta1}, beta2={self.beta2}, "
                f"tau={self.tau})")
