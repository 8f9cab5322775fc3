"""Parameter tracking for adaptive local optimizers: FAdamET and FAdamGT (Chen et al., 2025, "Parameter Tracking
in Federated Learning with Adaptive Optimization", arXiv 2502.02727, Algorithm 1; docs/algorithms.md 2.13).

The server keeps y (the average of all N clients' tracking terms y_i, which persist per client id) and
broadcasts it. A client's correction y - y_i is constant over its round and enters either

* ``position="after"`` (FAdamET, "estimate tracking"): x <- x - eta_l (A + y - y_i), where A is the optimizer's
  direction, i.e. the optimizer steps and then x <- x - eta_l (y - y_i); or
* ``position="before"`` (FAdamGT, "gradient tracking"): g <- g + y - y_i before the optimizer's moments.

Only the clients of Y_r, a subset of the round's sample S_r, refresh their term at the end of the round:

* FAdamET: y_i+ = y_i - y + (x^r - x_i^K) / (eta_l K)   (the mean of the K optimizer directions A)
* FAdamGT: y_i+ = (1/K) sum_k g_k                      (the raw gradients: after clipping, before correction)

and upload Delta_y_i = y_i+ - y_i (unweighted). The server adds y <- y + (1/N) sum_{i in Y_r} Delta_y_i, which
keeps y the average of all N clients' y_i (as SCAFFOLD's 1/N; docs/algorithms.md 5.11). K is the nominal number of
local steps in both formulas (docs/algorithms.md 5.14). With y = y_i = 0 (round 0) the correction is a no-op and the
round is the plain local optimizer.

Choice of Y_r: the paper samples it uniformly at random inside S_r (Algorithm 1 line 5). Here Y_r is the first
ceil(tracked_fraction |S_r|) clients of ``ctx.participants``, the round's sample *in sampling order*; since the
sample is a uniformly random ordered draw, its prefix is a uniformly random subset of S_r of that size, and every
process computes the same Y_r without communicating. (If ``participants`` were sorted, low client ids would
always be tracked; the trainer must pass the draw order.) The default 0.5 is the paper's Y = S/2 (sec. 6.1).

Only what the client trained is measured (``ctx.trained``), as in SCAFFOLD (:mod:`fedhf.corrections.control_variate`):
a tensor frozen this round keeps y_i (its zero change, or its missing gradient, is not a zero direction), a rank
component a client does not have is neither shifted nor refreshed, and y averages each component over the clients
that train it (``ServerContext.population``).

The client's second moment v_i is persisted by the state-sync axis, not here. This class does not inherit from
:class:`ControlVariate`: SCAFFOLD refreshes every participant's variate from the model change, tracking refreshes
a subset and (for GT) from the raw gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch

from ..core.context import ClientContext, ServerContext
from ..core.message import Message
from ..core.params import TensorDict, num_bytes
from .base import Correction

POSITIONS = ("after", "before")
STORE_KEY = "tracking_y"


def tracked_clients(participants: Sequence[int], fraction: float) -> Sequence[int]:
    """Y_r: the first ceil(fraction |S_r|) clients of the round's sample (in sampling order)."""
    return list(participants)[: math.ceil(fraction * len(participants))]


@dataclass(frozen=True)
class TrackingRound:
    """One client's tracking state over one round (the fields are fixed; ``grad_sum``'s tensors accumulate)."""

    y_i: TensorDict  # the client's tracking term at the start of the round
    shift: TensorDict  # y - y_i on the entries it trains (zero elsewhere)
    tracked: bool  # in Y_r: refreshes y_i and uploads Delta_y_i
    grad_sum: Optional[TensorDict]  # FAdamGT, tracked clients: the sum of the raw gradients (else None)


class ParameterTracking(Correction):
    name = "parameter_tracking"
    carries_state = True

    def __init__(self, position: str = "after", tracked_fraction: float = 0.5) -> None:
        if position not in POSITIONS:
            raise ValueError(f"`correction_kwargs.position` must be one of {POSITIONS}, got {position!r}.")
        if not 0.0 < tracked_fraction <= 1.0:
            raise ValueError(f"`correction_kwargs.tracked_fraction` must be in (0, 1], got {tracked_fraction}.")
        self.position = position
        self.tracked_fraction = float(tracked_fraction)

    def client_state_bytes(self, global_params: TensorDict) -> int:
        return num_bytes(global_params)  # one fp32 tensor per shared parameter, like x^r

    def server_init(self, global_params: TensorDict) -> TensorDict:
        return {f"y.{n}": torch.zeros_like(t) for n, t in global_params.items()}

    def client_begin(self, ctx: ClientContext) -> TrackingRound:
        if not ctx.participants:
            raise ValueError("ParameterTracking needs ctx.participants, the round's sampled clients.")
        stored = ctx.store.get(ctx.client_id, STORE_KEY)
        y_i = stored if stored is not None else {n: torch.zeros_like(t) for n, t in ctx.global_params.items()}
        tracked = ctx.client_id in tracked_clients(ctx.participants, self.tracked_fraction)
        return TrackingRound(
            y_i=y_i,
            # y - y_i is constant over the round: compute it once, not every step (zero where the client does not train).
            shift={n: ctx.trained.on_trained(n, ctx.correction_state[f"y.{n}"] - y_i[n]) for n in ctx.params},
            tracked=tracked,
            grad_sum=({n: torch.zeros_like(y_i[n]) for n in ctx.params}
                      if tracked and self.position == "before" else None))

    @torch.no_grad()
    def before_step(self, ctx: ClientContext, state: TrackingRound) -> None:
        if self.position != "before":
            return
        for name, p in ctx.params.items():
            if p.grad is None:
                continue
            if state.grad_sum is not None:  # the raw gradient, before the correction: FAdamGT's y_i+ averages it
                state.grad_sum[name].add_(p.grad.to(state.grad_sum[name].dtype))
            p.grad.add_(state.shift[name].to(p.grad.dtype))

    @torch.no_grad()
    def after_step(self, ctx: ClientContext, state: TrackingRound) -> None:
        if self.position != "after":
            return
        for name, p in ctx.params.items():
            if p.requires_grad:  # a tensor frozen this round (RoLoRA's other factor) is not stepped
                p.add_(state.shift[name].to(p.dtype), alpha=-ctx.local_lr)

    @torch.no_grad()
    def client_end(self, ctx: ClientContext, state: TrackingRound) -> Message:
        if not state.tracked:
            return Message()  # outside Y_r: sends nothing and keeps y_i
        y_i, K = state.y_i, ctx.local_steps
        if self.position == "after":
            scale = 1.0 / (ctx.local_lr * K)
            x_r = ctx.global_params
            new_y_i = {n: y_i[n] - ctx.correction_state[f"y.{n}"] + (x_r[n] - p.detach().to(x_r[n].dtype)) * scale
                       for n, p in ctx.params.items()}
        else:
            new_y_i = {n: s / K for n, s in state.grad_sum.items()}
        new_y_i = {n: ctx.trained.keep_untrained(n, t, y_i[n]) for n, t in new_y_i.items()}
        ctx.store.put(ctx.client_id, STORE_KEY, new_y_i)
        message = Message().put("dy", {n: new_y_i[n] - y_i[n] for n in new_y_i})  # unweighted: the server divides by N
        return message.put_scalar("n_track", 1.0)

    def sent_shapes(self, global_params: TensorDict) -> Dict[str, torch.Size]:
        return {f"dy.{n}": t.shape for n, t in global_params.items()}  # the change of the client's own state

    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        if ctx.num_clients < 1:
            raise ValueError("ParameterTracking needs ServerContext.num_clients (N) >= 1.")
        if not ctx.sums.has("dy"):  # every tracked client of the round was excluded: y stays
            return dict(state)
        dy = ctx.sums.tensors("dy", ctx.global_params)
        return {f"y.{n}": state[f"y.{n}"] + dy[n] / ctx.population(n) for n in ctx.global_params}
