"""State-sync rules: what happens to a local optimizer's Theta between rounds (ALGORITHMS.md 4.1 (2)).

* ``reset``             -- a fresh optimizer every round (FedAvg family, FedPAC Alg. 1).
* ``persist_local``     -- each client keeps its own Theta across its participations, never sent (FedPM's cached
  FOOF covariances, FAdam's v_hat, Fed-Sophia's h). Lives in the client state store, keyed by client id.
* ``average_warmstart`` -- clients upload Theta_i; the server averages them; the next round's clients start from
  Thetabar (FedPAC alignment, FedMuon's averaged momentum, FedLADA's averaged v, PreFed's averaged P).
* ``compressed_average`` (:mod:`fedhf.sync.compressed`) -- the same with a low-rank upload.

Only Theta moves; the rest of the optimizer state (first moments, eigenbases, counters) starts fresh every round.
Every rule also contributes Theta_i and ||Theta_i||^2 to the round's sums so the drift metric Delta_D
(ALGORITHMS.md 2.15) can be computed for any algorithm that has a Theta; only rules that really upload Theta
count its bytes.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..context import ClientContext, ServerContext
from ..params import TensorDict

STORE_KEY = "optimizer_theta"


def contribute(ctx: ClientContext, theta: TensorDict, counted: bool, nbytes: Optional[int] = None) -> None:
    """Add w_i Theta_i and w_i ||Theta_i||^2 (per tensor) to the sums; count the upload only if ``counted``."""
    if not theta:
        return
    if counted:
        ctx.send("theta", theta, scale=ctx.weight, nbytes=nbytes)
    else:  # a diagnostic for Delta_D: a real deployment would not send it
        ctx.sums.add_tensors("theta", theta, ctx.weight)
    ctx.sums.add_tensors("theta_sq", {k: t.double().pow(2).sum() for k, t in theta.items()}, ctx.weight)


class StateSync:
    """Base: no state moves. ``server_update`` returns what is broadcast next round (its bytes count as downlink)."""

    name = "reset"
    imports_theta = False  # needs an optimizer that can import Theta

    def client_begin(self, ctx: ClientContext, optimizer) -> None:
        pass

    def client_end(self, ctx: ClientContext, theta: TensorDict) -> None:
        contribute(ctx, theta, counted=False)

    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        return {}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class Reset(StateSync):
    name = "reset"


class PersistLocal(StateSync):
    name = "persist_local"
    imports_theta = True

    def client_begin(self, ctx: ClientContext, optimizer) -> None:
        theta = ctx.store.get(ctx.client_id, STORE_KEY)
        if theta:
            optimizer.import_theta(theta)

    def client_end(self, ctx: ClientContext, theta: TensorDict) -> None:
        contribute(ctx, theta, counted=False)
        ctx.store.put(ctx.client_id, STORE_KEY, theta)


class AverageWarmstart(StateSync):
    name = "average_warmstart"
    imports_theta = True

    def client_begin(self, ctx: ClientContext, optimizer) -> None:
        if ctx.sync_state:  # empty in round 0: a fresh optimizer
            optimizer.import_theta(ctx.sync_state)

    def client_end(self, ctx: ClientContext, theta: TensorDict) -> None:
        contribute(ctx, theta, counted=True)

    @torch.no_grad()
    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        total = ctx.sums.scalar("w")
        return {k[len("theta."):]: (v / total).float() for k, v in ctx.sums.items() if k.startswith("theta.")}
