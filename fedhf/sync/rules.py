"""State-sync rules: what happens to a local optimizer's Theta between rounds (docs/algorithms.md 4.1 (2)).

* ``reset``             -- a fresh optimizer every round (FedAvg family, FedPAC Alg. 1).
* ``persist_local``     -- each client keeps its own Theta across its participations, never sent (FedPM's cached
  FOOF covariances, FAdam's v_hat, Fed-Sophia's h). Lives in the client state store, keyed by client id.
  ``keep="state"`` keeps the optimizer's whole state instead (moments and step counters: DiLoCo's and MuLoCo's
  workers, whose inner optimizer is never touched between rounds; fedhf/optim/whole_state.py).
* ``average_warmstart`` -- clients upload Theta_i; the server averages them; the next round's clients start from
  Thetabar (FedPAC alignment, FedMuon's averaged momentum, FedLADA's averaged v, PreFed's averaged P).
* ``compressed_average`` (:mod:`fedhf.sync.compressed`) -- the same with a low-rank upload.
* ``desloc`` (:mod:`fedhf.sync.desloc`) -- each client keeps its whole state; each state key is averaged at its
  own period (DES-LOC).

Except under ``keep="state"`` and ``desloc``, only Theta moves; the rest of the optimizer state (first moments, eigenbases, counters) starts fresh every round.
A rule sends only what its server half uses: the rules that average Theta upload w_i Theta_i and w_i (their bytes
counted); the others send nothing. The drift metric Delta_D (docs/algorithms.md 2.15) is not this axis's: the
trainer hands every client's Theta_i to a round hook (fedhf/trainer/hooks/round_metrics.py).

The protocol (:class:`StateSync`): ``client_begin(ctx, optimizer)`` may import Theta into the fresh optimizer;
``client_end(ctx, theta, kinds)`` returns the client's message (``kinds``: the structure the optimizer declares
for each Theta entry, :mod:`fedhf.core.theta`); ``server_update(state, ctx)`` returns what is broadcast next round.
"""

from __future__ import annotations

from abc import ABC
from typing import Mapping, Optional

import torch

from ..core.context import ClientContext, ServerContext
from ..core.message import Message
from ..core.params import TensorDict
from ..core.theta import split_theta_key

STORE_KEY = "optimizer_theta"
STATE_STORE_KEY = "optimizer_state"  # the whole state (keep="state", desloc)
MOVES = ("theta", "state")


def upload(ctx: ClientContext, theta: TensorDict, nbytes: Optional[int] = None) -> Message:
    """w_i Theta_i and w_i, for a server half that averages Theta; its bytes are Theta's dense size, or ``nbytes``
    when what is sent is smaller (a low-rank factorisation)."""
    message = Message()
    if not theta:
        return message
    message.put("theta", theta, scale=ctx.weight, nbytes=nbytes)
    return message.put_scalar("w", ctx.weight)


def averaged(ctx: ServerContext) -> TensorDict:
    """sum_i w_i Theta_i / sum_i w_i from the round's sums (empty when no client sent Theta), each tensor in
    ``promote_types(global param dtype, float32)``: never the float64 of the sums, which would double the broadcast
    whose bytes the downlink counts, and never below float32, the precision fedhf's optimizers keep a half-precision
    parameter's state in (FederatedOptimizer.lazy_state). The trainer's global parameters are float32 copies
    (core.params.snapshot), so in a run this is float32: a client keeping bf16 state (torch AdamW on a bf16 model)
    casts it down on import, and the downlink counts it at float32, what is broadcast."""
    total = ctx.sums.scalar("w")
    if not total:
        return {}
    out = {}
    for key, value in ctx.sums.items():
        if key.startswith("theta."):
            param = ctx.global_params.get(split_theta_key(key[len("theta."):])[1])
            dtype = torch.float32 if param is None else torch.promote_types(param.dtype, torch.float32)
            out[key[len("theta."):]] = (value / total).to(dtype)
    return out


class StateSync(ABC):
    """The state-sync protocol, and itself no state moving ("reset"). ``server_update`` returns what is broadcast
    next round (its bytes count as downlink)."""

    name = "reset"
    imports_theta = False  # needs an optimizer that can import Theta
    averages_theta = False  # one client's Theta (or state) reaches the others (through the server's average)
    moves = "theta"  # what client_end receives and client_begin imports: Theta, or the whole state ("state")

    @property
    def carries_state(self) -> bool:
        """Some optimizer state outlives the round (Theta imported, or the whole state kept)."""
        return self.imports_theta or self.moves == "state"

    def client_begin(self, ctx: ClientContext, optimizer) -> None:
        pass

    def client_end(self, ctx: ClientContext, theta: TensorDict, kinds: Optional[Mapping[str, str]] = None) -> Message:
        return Message()

    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        return {}

    def client_state_bytes(self, theta_bytes: int) -> int:
        """Bytes this rule keeps per client in the client store, given the bytes of one client's Theta."""
        return 0

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class Reset(StateSync):
    name = "reset"


class PersistLocal(StateSync):
    """Each client keeps its own Theta (``keep="theta"``) or its optimizer's whole state (``keep="state"``) from one
    participation to its next; nothing is sent."""

    name = "persist_local"

    def __init__(self, keep: str = "theta") -> None:
        if keep not in MOVES:
            raise ValueError(f"`keep` must be one of {MOVES}, got {keep!r}.")
        self.keep = keep

    @property
    def moves(self) -> str:
        return self.keep

    @property
    def imports_theta(self) -> bool:
        return self.keep == "theta"  # the whole state is imported by any optimizer (fedhf/optim/whole_state.py)

    def client_begin(self, ctx: ClientContext, optimizer) -> None:
        kept = ctx.store.get(ctx.client_id, STORE_KEY if self.keep == "theta" else STATE_STORE_KEY)
        if kept and self.keep == "theta":
            optimizer.import_theta(kept)
        elif kept:
            optimizer.import_state(kept)

    def client_end(self, ctx: ClientContext, theta: TensorDict, kinds: Optional[Mapping[str, str]] = None) -> Message:
        ctx.store.put(ctx.client_id, STORE_KEY if self.keep == "theta" else STATE_STORE_KEY, theta)
        return Message()

    def client_state_bytes(self, theta_bytes: int) -> int:
        return theta_bytes


class AverageWarmstart(StateSync):
    name = "average_warmstart"
    imports_theta = True
    averages_theta = True

    def client_begin(self, ctx: ClientContext, optimizer) -> None:
        if ctx.sync_state:  # empty in round 0: a fresh optimizer
            optimizer.import_theta(ctx.sync_state)

    def client_end(self, ctx: ClientContext, theta: TensorDict, kinds: Optional[Mapping[str, str]] = None) -> Message:
        return upload(ctx, theta)

    @torch.no_grad()
    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        return averaged(ctx)
