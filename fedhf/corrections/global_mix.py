"""Global-direction mixing: FedCM (Xu et al., 2021), FedLADA (Sun et al., 2023), FedMuon (Liu et al., 2025),
FedPAC (Liu et al., "Taming Preconditioner Drift").

The server keeps the last round's global direction g_G = -mean_i Delta_i / (K eta_r) (zero in round 0) and
broadcasts it. A client step mixes it with its own direction with weight beta (ALGORITHMS.md 2.5, 2.8, 2.9):

* ``position="before"`` (FedCM): g <- (1 - beta) g + beta g_G, then the optimizer steps. With SGD this is
  FedCM exactly (coupled weight decay is added by SGD on top).
* ``position="after"`` (FedPAC, FedMuon, FedLADA): the optimizer runs at lr (1 - beta) eta_r, then
  x <- x - beta eta_r g_G on every trainable tensor, i.e. x <- x - eta_r [(1 - beta) P(g) + beta g_G].
  For a preconditioned optimizer this keeps g_G out of the preconditioner's statistics.

With beta = 0 both positions are the plain local optimizer.
"""

from __future__ import annotations

import torch

from ..context import ClientContext, ServerContext
from ..params import TensorDict
from .base import Correction

POSITIONS = ("before", "after")


class GlobalMix(Correction):
    name = "global_mix"

    def __init__(self, beta: float = 0.5, position: str = "after") -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"`correction_kwargs.beta` must be in [0, 1), got {beta}.")
        if position not in POSITIONS:
            raise ValueError(f"`correction_kwargs.position` must be one of {POSITIONS}, got {position!r}.")
        self.beta = float(beta)
        self.position = position

    @property
    def lr_scale(self) -> float:
        return 1.0 - self.beta if self.position == "after" else 1.0

    def server_init(self, global_params: TensorDict) -> TensorDict:
        return {f"g.{n}": torch.zeros_like(t) for n, t in global_params.items()}

    @torch.no_grad()
    def before_step(self, ctx: ClientContext) -> None:
        if self.position != "before" or self.beta == 0:
            return
        for name, p in ctx.params.items():
            if p.grad is not None:
                p.grad.mul_(1 - self.beta).add_(ctx.correction_state[f"g.{name}"].to(p.grad.dtype), alpha=self.beta)

    @torch.no_grad()
    def after_step(self, ctx: ClientContext) -> None:
        if self.position != "after" or self.beta == 0:
            return
        for name, p in ctx.params.items():
            if p.requires_grad:  # a tensor frozen this round (RoLoRA's other factor) is not stepped
                p.add_(ctx.correction_state[f"g.{name}"].to(p.dtype), alpha=-self.beta * ctx.round_lr)

    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        scale = -1.0 / (ctx.local_steps * ctx.round_lr)
        return {f"g.{n}": d * scale for n, d in ctx.mean_delta.items()}
