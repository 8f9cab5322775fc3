"""Communication compression as a round hook: each client's messages are replaced by what a receiver decodes from
their compressed form, and counted at their encoded size; the broadcast likewise (fedhf/compression/,
docs/compression.md).

Uplink (``uplink_compression``, ``on_client_message``): every tensor counted at its dense size
(:attr:`fedhf.core.message.Message.dense`: the model change ``dx``, buffers, every component's state) that the plan
selects is encoded and decoded; its bytes in the message become the encoded bytes. With ``error_feedback`` the
residual (what compression dropped) is kept per client in the client store (``compression.residual``: spilled,
checkpointed, resumed as every client state) and added to the client's next message. Messages carry w_i-scaled
tensors; every compressor here commutes with a positive scale (block scales, top-k supports and PowerSGD's
factors scale with it), and w_i is fixed per client, so the residual stays in the message's scale.

Downlink (``downlink_compression``, ``before_round`` / ``broadcast_bytes`` / ``after_sums``): the server keeps the
model the clients hold, x_hat, in the run state (``compression_state``, checkpointed). The first broadcast is dense
(the clients hold nothing to difference against); then, with error feedback, x_hat += decode(C(x - x_hat)) (the
compressed difference: EF on the downlink, what was dropped stays in x - x_hat); without it, x_hat = decode(C(x)).
The clients train from x_hat; the server's own x is put back before its update, so x^{r+1} = x^r + D. The broadcast
correction and sync states are compressed the same way. Every client is taken to hold the same x_hat (a broadcast
channel), as the downlink count, per sampled client, assumes.

On both links a synced optimizer state the local optimizer declares non-negative or symmetric PSD is put back in
its domain after decoding (:mod:`fedhf.compression.domain`; the uplink residual is formed from the projected value,
so error feedback's identity holds). Under DP ``uplink_compression_rel_error`` is not logged: it is computed from
each client's message before the clip.

Random draws (stochastic rounding, PowerSGD's first Q) come from a generator per tensor seeded by (seed, round,
client, stream, tensor key): nothing to checkpoint, and a resumed run draws the same numbers.
"""

from __future__ import annotations

import math
import time
import zlib
from typing import Dict, Optional, Tuple

import torch

from ...compression import CompressionPlan, compress_step, parse_plan
from ...compression.domain import keep_domain
from ...compression.plan import compressed_model_change  # noqa: F401  (the memory plan imports it from here)
from ...core.message import Message
from ...core.params import TensorDict
from ...core.schedule import stream_seed
from ...core.theta import GENERAL, split_theta_key
from ...optim.base import OptimizerHooks
from .base import ClientMessages, RoundHook

UPLINK_STREAM, DOWNLINK_STREAM = 0xC0, 0xC1
RESIDUAL, STATE = "compression.residual", "compression.state"
#: RunState groups that are broadcast, and their key prefix in the downlink plan.
BROADCAST = (("global_params", "model"), ("correction_state", "correction"), ("sync_state", "sync"))


class Compression(RoundHook):
    def __init__(self, uplink: Optional[str], downlink: Optional[str], error_feedback: bool,
                 optimizer: type = OptimizerHooks, released: bool = True) -> None:
        self.optimizer = optimizer  # the local optimizer's class: it declares its states' kinds
        self.released = released  # False under DP: the error is computed before clipping, from client data
        self.uplink: CompressionPlan = parse_plan(uplink, "uplink_compression")
        self.downlink: CompressionPlan = parse_plan(downlink, "downlink_compression")
        self.feedback = bool(error_feedback)
        self._server_groups: Dict[str, TensorDict] = {}  # the server's own groups while the clients hold x_hat
        self._broadcast_saving = 0  # dense - encoded bytes of one client's broadcast this round
        self._seconds, self._error_sq, self._norm_sq = 0.0, [], []  # squares summed exactly (math.fsum): the
        # sums must not depend on the order of the keys, which a resumed run reads sorted

    def kind(self, key: str) -> str:
        """The structure of a sent or broadcast state sync entry (``sync.theta.<theta key>`` up, ``sync.<theta
        key>`` down), as the local optimizer declares it (:mod:`fedhf.core.theta`); general for anything else."""
        head, _, rest = key.partition(".")
        if head != "sync" or not issubclass(self.optimizer, OptimizerHooks):
            return GENERAL
        state_key, _ = split_theta_key(rest[len("theta."):] if rest.startswith("theta.") else rest)
        return self.optimizer.theta_kind(state_key)

    # ------------------------------------------------------------------ uplink
    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        if not self.uplink.active:
            return sent
        start = time.perf_counter()
        store, cid = ctx.store, ctx.client_id
        residuals = dict(store.get(cid, RESIDUAL) or {})
        states = dict(store.get(cid, STATE) or {})
        draws = _Draws(trainer.args.seed, ctx.round, cid, UPLINK_STREAM, trainer.model_device)
        own = self._compress(sent.own, "", residuals, states, draws)
        components = {ns: self._compress(m, ns, residuals, states, draws) for ns, m in sent.components.items()}
        if residuals:
            store.put(cid, RESIDUAL, residuals)
        if states:
            store.put(cid, STATE, states)
        self._seconds += time.perf_counter() - start
        return ClientMessages(own, components, sent.theta)

    def _compress(self, message: Message, namespace: str, residuals: TensorDict, states: TensorDict,
                  draws: "_Draws") -> Message:
        out = Message(dict(message.tensors), message.nbytes, dict(message.dense))
        for key, dtype in message.dense.items():
            full = f"{namespace}.{key}" if namespace else key
            compressor = self.uplink.pick(full)
            x = message.tensors[key]
            if compressor is None or x.ndim == 0 or not dtype.is_floating_point:
                continue
            prior = residuals.get(full) if self.feedback else None
            value, residual, encoded = compress_step(x, prior, compressor, draws.of(full), states.get(full),
                                                     self.feedback)
            kept = keep_domain(value, self.kind(full))
            if residual is not None:  # the residual of what is sent: EF's identity holds
                residual = residual + (value - kept)
            value = kept
            out.tensors[key] = value
            out.nbytes += encoded.nbytes - x.numel() * _itemsize(dtype)
            out.dense.pop(key)  # now in its encoded form
            if residual is not None:
                residuals[full] = residual
            if encoded.state is not None:
                states[full] = encoded.state
            compressed = x if prior is None else x + prior  # what the compressor was given
            self._error_sq.append(float((compressed - value).pow(2).sum()))
            self._norm_sq.append(float(compressed.pow(2).sum()))
        return out

    # ------------------------------------------------------------------ downlink
    def before_round(self, trainer, run) -> None:
        self._broadcast_saving = 0
        if not self.downlink.active:
            return
        start = time.perf_counter()
        draws = _Draws(trainer.args.seed, run.rounds_done, 0, DOWNLINK_STREAM, trainer.model_device)
        for group, prefix in BROADCAST:
            server = getattr(run, group)
            held, saving = self._held(server, prefix, run.compression_state, draws)
            self._server_groups[group] = server
            setattr(run, group, held)
            self._broadcast_saving += saving
        self._seconds += time.perf_counter() - start

    def _held(self, server: TensorDict, prefix: str, state: TensorDict, draws: "_Draws") -> Tuple[TensorDict, int]:
        """What the clients hold after this round's broadcast of one group, and the bytes it saved."""
        held, saving = dict(server), 0
        for name, x in server.items():
            key = f"{prefix}.{name}"
            compressor = self.downlink.pick(key)
            if compressor is None or x.ndim == 0 or not x.dtype.is_floating_point:
                continue
            previous = state.get(f"held.{key}")
            if previous is None:  # the first broadcast: dense
                state[f"held.{key}"] = x.detach().clone()
                continue
            base = previous.to(torch.float64) if self.feedback else 0.0
            sent, _, encoded = compress_step(x.to(torch.float64) - base, None, compressor, draws.of(key),
                                             state.get(f"q.{key}"), feedback=False)
            held[name] = state[f"held.{key}"] = keep_domain(base + sent, self.kind(key)).to(x.dtype)
            if encoded.state is not None:
                state[f"q.{key}"] = encoded.state
            saving += x.numel() * x.element_size() - encoded.nbytes
        return held, saving

    def broadcast_bytes(self, trainer, run, dense: int) -> int:
        return dense - self._broadcast_saving

    def after_sums(self, trainer, run, sums) -> None:
        for group, server in self._server_groups.items():  # the server updates its own x, not x_hat
            setattr(run, group, server)
        self._server_groups = {}

    # ------------------------------------------------------------------ the round's log
    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        if not (self.uplink.active or self.downlink.active):
            return
        entry["compression_seconds"] = self._seconds  # this process's encode + decode time this round
        norm_sq = math.fsum(self._norm_sq)
        if norm_sq > 0 and self.released:
            entry["uplink_compression_rel_error"] = (math.fsum(self._error_sq) / norm_sq) ** 0.5
        self._seconds, self._error_sq, self._norm_sq = 0.0, [], []


class _Draws:
    """One generator per tensor, seeded by (seed, round, client, stream, the key's CRC-32): the draws do not depend
    on the order tensors come in (a resumed run's dicts are in the checkpoint's sorted order) nor on which other
    tensors are compressed."""

    def __init__(self, seed: int, round_index: int, client: int, stream: int, device) -> None:
        self.keys, self.device = (seed, round_index, client, stream), device

    def of(self, key: str) -> torch.Generator:
        seed = stream_seed(*self.keys, zlib.crc32(key.encode()))
        return torch.Generator(device=self.device).manual_seed(seed)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
