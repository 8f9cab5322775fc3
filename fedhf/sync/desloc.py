"""DES-LOC: each optimizer state is averaged over the clients at its own period.

Iacob et al., 2025, "DES-LOC: Desynced Low Communication Adaptive Optimizers for Training Foundation Models"
(arXiv 2505.22549). Workers run Adam locally; the parameters are averaged every K_x steps, the first moment every
K_u and the second moment every K_v, each on its own schedule, because the moments change more slowly than the
parameters (the paper recommends K_u = 3 K_x and K_v = 6 K_x). Local Adam is the case K_x = K_u = K_v: every
state averaged together.

In fedhf a round is K_x: the trainer averages the parameters every round. This rule keeps each client's whole
optimizer state (fedhf/optim/whole_state.py: moments and step counters) in the client store between its rounds,
and at the end of round r (0-based) also averages the state keys whose period divides r + 1:

    first moment  (``exp_avg``, Muon's ``momentum_buffer``)  every ``first_moment_period``  rounds (K_u / K_x),
    second moment (``exp_avg_sq``)                            every ``second_moment_period`` rounds (K_v / K_x);

the average is the weighted mean sum_i w_i s_i / sum_i w_i over the round's clients, and the next round's clients
start from it for those keys and from their own kept state for the others. Other state keys (step counters) are
never averaged. A client that has not trained before starts from a fresh optimizer. With both periods 1 this is
Local Adam: parameters and both moments averaged every round.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch

from ..core.context import ClientContext, ServerContext
from ..core.message import Message
from ..core.params import TensorDict
from ..core.theta import split_theta_key
from .rules import STATE_STORE_KEY, StateSync, averaged, upload

FIRST_MOMENT_KEYS = ("exp_avg", "momentum_buffer")
SECOND_MOMENT_KEYS = ("exp_avg_sq",)


def synced_now(round_index: int, period: int) -> bool:
    """Whether a state with this period is averaged at the end of round ``round_index`` (0-based)."""
    return (round_index + 1) % period == 0


class DesLoc(StateSync):
    name = "desloc"
    averages_theta = True  # the averaged moments reach every client
    moves = "state"

    def __init__(self, first_moment_period: int = 3, second_moment_period: int = 6) -> None:
        for label, period in (("first_moment_period", first_moment_period),
                              ("second_moment_period", second_moment_period)):
            if not isinstance(period, int) or period < 1:
                raise ValueError(f"`{label}` must be an integer >= 1 (rounds between averages), got {period!r}.")
        self.first_moment_period = first_moment_period
        self.second_moment_period = second_moment_period

    def period(self, state_key: str) -> Optional[int]:
        """Rounds between averages of this state key; None: never averaged (kept local)."""
        if state_key in FIRST_MOMENT_KEYS:
            return self.first_moment_period
        if state_key in SECOND_MOMENT_KEYS:
            return self.second_moment_period
        return None

    def client_begin(self, ctx: ClientContext, optimizer) -> None:
        own = ctx.store.get(ctx.client_id, STATE_STORE_KEY)
        if own:  # its own state, the keys averaged last round replaced by their average (in the state's dtype)
            averaged = {k: v.to(own[k].dtype) for k, v in ctx.sync_state.items() if k in own}
            optimizer.import_state({**own, **averaged})

    def client_end(self, ctx: ClientContext, theta: TensorDict, kinds: Optional[Mapping[str, str]] = None) -> Message:
        ctx.store.put(ctx.client_id, STATE_STORE_KEY, theta)
        due = {}
        for key, value in theta.items():
            period = self.period(split_theta_key(key)[0])
            if period is not None and synced_now(ctx.round, period):
                due[key] = value
        return upload(ctx, due)

    @torch.no_grad()
    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        return averaged(ctx)  # empty when nothing was due this round: every client keeps its own moments

    def client_state_bytes(self, theta_bytes: int) -> int:
        return theta_bytes
