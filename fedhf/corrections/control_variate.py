"""SCAFFOLD's control variates (Karimireddy et al., 2020, option II), applied before preconditioning.

Client step: g <- g - c_i + c.  End of round: c_i+ = c_i - c + (x^r - x_i^K) / (K eta);
send Delta_c_i = c_i+ - c_i.  Server: c <- c + (1/N) sum_{i in S} Delta_c_i (docs/algorithms.md 2.4).
c_i persists per client id in the client state store; c is broadcast. With c = c_i = 0 the first round is
FedAvg; with identical clients c_i = c always, so the correction vanishes and SCAFFOLD equals FedAvg.

Only what the client trained is measured (``ctx.trained``): a tensor frozen this round (RoLoRA) keeps c_i, and c,
as they were (its zero change is not a zero gradient), and a rank component a client does not have
(``lora_client_ranks``) is neither shifted nor refreshed, and c averages each component over the clients that
train it (``ServerContext.population``): c_j = mean of c_ij over those clients, as SCAFFOLD's c = mean_i c_i.

Unlike the FedPAC/FedMuon reference code (which adds the correction as a Python float to the loss, so it has
no gradient effect, and keeps c_i per worker instead of per client), this is the real algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch

from ..core.context import ClientContext, ServerContext
from ..core.message import Message
from ..core.params import TensorDict, num_bytes
from .base import Correction


@dataclass(frozen=True)
class VariateRound:
    """One client's SCAFFOLD state over one round."""

    c_i: TensorDict  # the client's control variate at the start of the round
    shift: TensorDict  # c - c_i on the entries it trains (zero elsewhere), added to every step's gradient


class ControlVariate(Correction):
    name = "control_variate"
    carries_state = True

    def client_state_bytes(self, global_params: TensorDict) -> int:
        return num_bytes(global_params)  # one fp32 tensor per shared parameter, like x^r

    def server_init(self, global_params: TensorDict) -> TensorDict:
        return {f"c.{n}": torch.zeros_like(t) for n, t in global_params.items()}

    def _client_variate(self, ctx: ClientContext) -> TensorDict:
        stored = ctx.store.get(ctx.client_id, "scaffold_c")
        return stored if stored is not None else {n: torch.zeros_like(t) for n, t in ctx.global_params.items()}

    def client_begin(self, ctx: ClientContext) -> VariateRound:
        c_i = self._client_variate(ctx)
        # c - c_i is constant over the round: compute it once, not every step (zero where the client does not train).
        return VariateRound(c_i, {n: ctx.trained.on_trained(n, ctx.correction_state[f"c.{n}"] - c_i[n])
                                  for n in ctx.params})

    @torch.no_grad()
    def before_step(self, ctx: ClientContext, state: VariateRound) -> None:
        for name, p in ctx.params.items():
            if p.grad is not None:
                p.grad.add_(state.shift[name].to(p.grad.dtype))

    @torch.no_grad()
    def client_end(self, ctx: ClientContext, state: VariateRound) -> Message:
        c_i = state.c_i
        scale = 1.0 / (ctx.local_steps * ctx.local_lr)
        estimate = {n: c_i[n] - ctx.correction_state[f"c.{n}"] + (ctx.global_params[n] - p.detach().float()) * scale
                    for n, p in ctx.params.items()}
        new_c_i = {n: ctx.trained.keep_untrained(n, e, c_i[n]) for n, e in estimate.items()}
        ctx.store.put(ctx.client_id, "scaffold_c", new_c_i)
        return Message().put("dc", {n: new_c_i[n] - c_i[n] for n in new_c_i})  # unweighted: the server divides by N

    def sent_shapes(self, global_params: TensorDict) -> Dict[str, torch.Size]:
        return {f"dc.{n}": t.shape for n, t in global_params.items()}  # the change of the client's own state

    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        dc = ctx.sums.tensors("dc", ctx.global_params)
        return {f"c.{n}": state[f"c.{n}"] + dc[n] / ctx.population(n) for n in ctx.global_params}
