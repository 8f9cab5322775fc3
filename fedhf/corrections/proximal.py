"""FedProx's proximal term (Li et al., 2020, "Federated Optimization in Heterogeneous Networks").

Before preconditioning: g <- g + mu (x - x^r) on every trainable tensor (docs/algorithms.md 2.3). With mu = 0 the
client step is the plain local optimizer's, so FedProx(mu=0) is FedAvg.
"""

from __future__ import annotations

import torch

from ..core.context import ClientContext
from .base import Correction


class Proximal(Correction):
    name = "proximal"

    def __init__(self, mu: float = 1e-3) -> None:
        if mu < 0:
            raise ValueError(f"`correction_kwargs.mu` must be >= 0, got {mu}.")
        self.mu = float(mu)

    @torch.no_grad()
    def before_step(self, ctx: ClientContext, state: None) -> None:
        if self.mu == 0:
            return
        for name, p in ctx.params.items():
            if p.grad is not None:
                # no pull on entries the client does not train (a rank component it lacks is zero, not a step)
                p.grad.add_(ctx.trained.on_trained(name, p - ctx.global_params[name].to(p.dtype)), alpha=self.mu)
