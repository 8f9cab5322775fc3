"""Aggregation is a sum.

Every client turns its round into messages of named tensors (the trainer's ``dx.<param>`` and scalars such as
``w`` and ``loss``; each component's :class:`fedhf.core.message.Message`, namespaced as ``correction.dc.<param>``,
``sync.theta.<key>``, ``server.P.<weight>``). The round's messages are added into one :class:`RoundSums`; every server rule then runs
deterministically on the sums (docs/algorithms.md section 4.2). Because nothing needs the list of individual
messages, spreading clients over processes costs exactly one all-reduce per round (:meth:`all_reduce`). The one
exception is the robust aggregators, which say so (``gathers = True``) and receive every update (:meth:`gather`).
A read of a key nobody sent is an error (:class:`MissingSum`), never a silent zero.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple

import torch

from .message import Message
from .params import TensorDict


class MissingSum(KeyError):
    """A server half read a sum that no client sent (a typo in a key, or a component that did not send it)."""


class RoundSums:
    """Running sums of client messages, kept in float64 so the order of addition barely matters."""

    def __init__(self) -> None:
        self._sums: Dict[str, torch.Tensor] = {}
        # (client id, update) pairs, only for server rules that gather instead of sum (robust aggregators).
        self.gathered: List[Tuple[int, TensorDict]] = []

    def add(self, key: str, value, scale: float = 1.0) -> None:
        value = torch.as_tensor(value, dtype=torch.float64)
        if scale != 1.0:
            value = value * scale
        if key in self._sums:
            self._sums[key] += value
        else:
            self._sums[key] = value.clone()

    def set(self, key: str, value) -> None:
        """Replace one sum (a transform of the sums before the server reads them: noise, decoding, a fixed
        denominator)."""
        self._sums[key] = torch.as_tensor(value, dtype=torch.float64)

    def add_tensors(self, prefix: str, tensors: Mapping[str, torch.Tensor], scale: float = 1.0) -> None:
        for name, tensor in tensors.items():
            self.add(f"{prefix}.{name}", tensor.detach(), scale)

    def add_message(self, message: Message, namespace: str = "") -> None:
        """Add one component's message, its keys under ``<namespace>.`` (none: as they are)."""
        for key, value in message.tensors.items():
            self.add(f"{namespace}.{key}" if namespace else key, value)

    def within(self, namespace: str) -> "RoundSums":
        """The sums of one component's messages, keys without the ``<namespace>.`` (the tensors are shared)."""
        view, head = RoundSums(), namespace + "."
        view._sums = {k[len(head):]: v for k, v in self._sums.items() if k.startswith(head)}
        view.gathered = self.gathered
        return view

    def pop(self, key: str) -> torch.Tensor:
        """Remove one sum (a round hook that replaces the round's sums: the clock's buffered reports)."""
        return self._sums.pop(key)

    def has(self, prefix: str) -> bool:
        """Whether any client sent a key under ``<prefix>.``."""
        return any(k.startswith(prefix + ".") for k in self._sums)

    def scalar(self, key: str, default: float = 0.0) -> float:
        return float(self._sums[key]) if key in self._sums else default

    def keys(self) -> List[str]:
        return list(self._sums)

    def get(self, key: str) -> torch.Tensor:
        """One summed tensor (float64) by its full key, e.g. ``"P.<param>"``."""
        if key not in self._sums:
            raise MissingSum(f"No client sent {key!r} this round (sent: {sorted(self._sums)[:8]}...).")
        return self._sums[key]

    def items(self) -> List[Tuple[str, torch.Tensor]]:
        return list(self._sums.items())

    def tensors(self, prefix: str, like: TensorDict) -> TensorDict:
        """The summed tensors under ``prefix`` for every name of ``like``, in ``like``'s dtype; a name nobody sent
        raises :class:`MissingSum`."""
        return {name: self.get(f"{prefix}.{name}").to(ref.dtype) for name, ref in like.items()}

    def gather(self, client_id: int, tensors: TensorDict) -> None:
        self.gathered.append((int(client_id), {k: v.detach() for k, v in tensors.items()}))

    def gathered_in_client_order(self) -> List[TensorDict]:
        return [tensors for _, tensors in sorted(self.gathered, key=lambda item: item[0])]

    def all_reduce(self, gather: bool = False, device: Optional[torch.device] = None) -> None:
        """Sum over processes: one all-reduce of every sum packed into a single buffer.

        A process may have trained no client (or only excluded ones) this round, so the key sets can differ:
        they are agreed first (a small gather of names and shapes), missing keys count as zeros.
        ``gather=True`` (the same on every process) also shares the individually gathered updates.
        ``device``: the model's (default: the CPU). The buffer is packed there, since NCCL reduces GPU tensors
        only, and every sum and gathered update is left there, as the server rules combine them with the model's.
        No-op when torch.distributed is not initialised.
        """
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        device = torch.device("cpu") if device is None else device
        if gather:  # robust aggregation: every process needs every update (between our own processes)
            parts = [None] * dist.get_world_size()
            # sent from the CPU (a pickled GPU tensor is unpickled onto its sender's GPU), kept on ``device``
            mine = [(cid, {k: v.cpu() for k, v in update.items()}) for cid, update in self.gathered]
            dist.all_gather_object(parts, mine)
            self.gathered = [(cid, {k: v.to(device) for k, v in update.items()})
                             for part in parts for cid, update in part]
        shapes = [None] * dist.get_world_size()
        dist.all_gather_object(shapes, {k: tuple(v.shape) for k, v in self._sums.items()})
        for rank_shapes in shapes:
            for key, shape in rank_shapes.items():
                if key not in self._sums:
                    self._sums[key] = torch.zeros(shape, dtype=torch.float64, device=device)
        keys = sorted(self._sums)
        if not keys:  # nothing anywhere (e.g. drift of an optimizer without Theta)
            return
        flat = torch.cat([self._sums[k].to(device).reshape(-1) for k in keys])
        dist.all_reduce(flat)
        offset = 0
        for key in keys:
            n = self._sums[key].numel()
            self._sums[key] = flat[offset:offset + n].view(self._sums[key].shape)
            offset += n
