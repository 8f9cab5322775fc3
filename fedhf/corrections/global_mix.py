"""Global-direction mixing: FedCM (Xu et al., 2021), FedLADA (Sun et al., 2023), FedMuon (Liu et al., 2025),
FedPAC (Liu et al., "Taming Preconditioner Drift").

The server keeps the last round's global direction g_G = -mean_i Delta_i / (K eta_r) (zero in round 0) and
broadcasts it. A client step mixes it with its own direction with weight beta (docs/algorithms.md 2.5, 2.8, 2.9):

* ``position="before"`` (FedCM): g <- (1 - beta) g + beta g_G, then the optimizer steps. With SGD this is
  FedCM exactly (coupled weight decay is added by SGD on top).
* ``position="after"`` (FedPAC, FedMuon, FedLADA): the optimizer runs at lr (1 - beta) eta_r, then
  x <- x - beta eta_r g_G on every trainable tensor, i.e. x <- x - eta_r [(1 - beta) P(g) + beta g_G].
  For a preconditioned optimizer this keeps g_G out of the preconditioner's statistics.

With beta = 0 both positions are the plain local optimizer.

g_G is measured on what the clients trained (``ctx.trained``): a tensor frozen this round (RoLoRA's other factor)
keeps its last direction, since its zero change is not a zero gradient (otherwise g_G of a factor would be zero
exactly when that factor trains next). Under ``lora_client_ranks`` a rank component is averaged over the clients
that trained it, sum_i w_i m_i Delta_i / sum_i w_i m_i (m_i: client i's mask), so a client's truncation of the
components it lacks is not read as a direction; a component nobody trained keeps its last direction.
"""

from __future__ import annotations

import torch

from ..core.context import ClientContext, ServerContext
from ..core.message import Message
from ..core.params import TensorDict
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
    def carries_state(self) -> bool:
        return self.beta > 0  # with beta = 0, g_G is kept but never applied

    @property
    def lr_scale(self) -> float:
        return 1.0 - self.beta if self.position == "after" else 1.0

    def server_init(self, global_params: TensorDict) -> TensorDict:
        return {f"g.{n}": torch.zeros_like(t) for n, t in global_params.items()}

    @torch.no_grad()
    def before_step(self, ctx: ClientContext, state: None) -> None:
        if self.position != "before" or self.beta == 0:
            return
        for name, p in ctx.params.items():
            if p.grad is not None:
                g_global = ctx.trained.on_trained(name, ctx.correction_state[f"g.{name}"])  # none where not trained
                p.grad.mul_(1 - self.beta).add_(g_global.to(p.grad.dtype), alpha=self.beta)

    @torch.no_grad()
    def after_step(self, ctx: ClientContext, state: None) -> None:
        if self.position != "after" or self.beta == 0:
            return
        for name, p in ctx.params.items():
            if p.requires_grad:  # a tensor frozen this round (RoLoRA's other factor) is not stepped
                p.add_(ctx.correction_state[f"g.{name}"].to(p.dtype), alpha=-self.beta * ctx.round_lr)

    @torch.no_grad()
    def client_end(self, ctx: ClientContext, state: None) -> Message:
        """Under ``lora_client_ranks`` only: w_i m_i Delta_i and w_i m_i of the tensors trained in part. Not counted
        in the uplink: a server forms both from the dx it receives and the client's rank."""
        masks = ctx.trained.masks
        if not masks:
            return Message()
        delta = {n: ctx.trained.on_trained(n, ctx.params[n].detach().float() - ctx.global_params[n]) for n in masks}
        return Message().put("dx", delta, scale=ctx.weight, nbytes=0).put("w", dict(masks), scale=ctx.weight, nbytes=0)

    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        scale = -1.0 / (ctx.local_steps * ctx.round_lr)
        partly = {k[len("w."):] for k in ctx.sums.keys() if k.startswith("w.")}
        new = {}
        for n, d in ctx.mean_delta.items():
            if n in ctx.frozen:  # not trained this round: the last direction stays
                new[f"g.{n}"] = state[f"g.{n}"]
            elif n in partly:  # the mean over the clients that trained each component
                old, w = state[f"g.{n}"], ctx.sums.get(f"w.{n}")
                mean = ctx.sums.get(f"dx.{n}") / w.clamp(min=torch.finfo(w.dtype).tiny)
                new[f"g.{n}"] = torch.where(w > 0, mean * scale, old.double()).to(old.dtype)
            else:
                new[f"g.{n}"] = d * scale
        return new
