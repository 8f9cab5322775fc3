"""The covariance-preconditioned optimizer of PreFed (Tao et al., AISTATS 2022, "Preconditioned Federated
Learning", Algorithm 2; docs/algorithms.md 1.8, 2.14).

Like SDProp / AdaBelief, it scales the momentum by the running *variance* of the gradient around the momentum
rather than by the raw second moment::

    g <- g + lambda p                                 (coupled weight decay, off by default)
    m <- b1 m + (1 - b1) g
    P <- b2 P + (1 - b2) (g - m)*(g - m)              (with the *updated* m)
    p <- p - lr m / sqrt(P + tau)

No bias correction. Theta is ``P``: PreFed averages it over the participants and warm-starts every client from
the average, while m restarts at 0 each round (the server never updates it; docs/algorithms.md 5.12).
With P = 0 at round 0 the first steps are about lr m / sqrt(tau), i.e. large for a small tau.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..core.theta import NONNEGATIVE
from ..core.updates import covariance_moments_
from .base import FederatedOptimizer, NamedParams
from .state_size import copies, state_dtype


@torch.no_grad()
def covariance_direction(grad: torch.Tensor, m: torch.Tensor, P: torch.Tensor, beta1: float, beta2: float,
                         tau: float) -> torch.Tensor:
    """Update m and P in place (the server PreFedOpt's moments, :func:`fedhf.core.updates.covariance_moments_`); return
    the direction m / sqrt(P + tau)."""
    covariance_moments_(grad, m, P, beta1, beta2)
    return m / (P + tau).sqrt()


class CovarianceAdam(FederatedOptimizer):
    """PreFed's client optimizer. Defaults: lr 1e-3 (not stated in the paper; docs/algorithms.md 2.14 resolves it
    like the Adam-type baselines), betas (0.9, 0.9) and tau 1e-3 (paper sec. 6), no weight decay."""

    theta_keys = ("P",)
    theta_kinds = {"P": NONNEGATIVE}

    def __init__(self, params: NamedParams, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.9),
                 tau: float = 1e-3, weight_decay: float = 0.0) -> None:
        if lr < 0 or weight_decay < 0:
            raise ValueError(f"lr and weight_decay must be >= 0, got {lr}, {weight_decay}.")
        if tau <= 0:
            raise ValueError(f"tau must be > 0 (it keeps m / sqrt(P + tau) finite at P = 0), got {tau}.")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}.")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "tau": tau, "weight_decay": weight_decay})

    @classmethod
    def state_bytes(cls, params, **kwargs) -> int:
        return copies(params, 2, state_dtype)  # m, P

    def update(self) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state, dtype = self.lazy_state(p, ("m", "P"))
                grad = p.grad.to(dtype)
                if group["weight_decay"]:
                    grad = grad.add(p.to(dtype), alpha=group["weight_decay"])
                direction = covariance_direction(grad, state["m"], state["P"], beta1, beta2, group["tau"])
                p.add_(direction.to(p.dtype), alpha=-group["lr"])
