"""The compressor protocol: a pure encode/decode pair per tensor, what it sends in bytes, and what it promises.

A compressor turns one float64 tensor into an :class:`Encoded` value: the tensors that would go over the wire, in
their wire dtypes (int8 codes, packed 4-bit codes, fp32 block scales, int32 indices, low-rank factors), so the
bytes a message costs are *computed from the encoded tensors themselves* (:attr:`Encoded.nbytes`), never from a
formula kept beside them. Decoding is deterministic; the only randomness (stochastic rounding, PowerSGD's first
Q) comes from the ``torch.Generator`` the caller passes, seeded per (seed, round, client), so a resumed run
draws the same numbers.

Each compressor declares, as class attributes (read by the composition table, never probed):

* ``unbiased``: E[decode(encode(x))] = x over the generator's draws (stochastic rounding; the identity).
* ``linear``: the sum of several clients' encodings decodes to the sum of their tensors, so a server (or a
  secure aggregation) may add encodings before decoding. Only a shared, fixed scale gives that; per-client block
  scales, top-k supports and low-rank bases differ between clients, so those compressors are not linear.
* ``stateful``: keeps a state per tensor between rounds (PowerSGD's warm-started Q), stored by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch

from ..core.registry import Registry


@dataclass
class Encoded:
    """What goes over the wire for one tensor: named wire tensors, and the shape to decode into."""

    tensors: Dict[str, torch.Tensor]
    shape: Tuple[int, ...]
    state: Optional[torch.Tensor] = field(default=None)  # a stateful compressor's next state (kept, not sent)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class Compressor:
    """One encode/decode pair; subclasses override :meth:`encode` and :meth:`decode`."""

    name = "none"
    unbiased = True
    linear = True
    stateful = False

    def encode(self, x: torch.Tensor, generator: torch.Generator,
               state: Optional[torch.Tensor] = None) -> Encoded:
        """The identity, sent as fp32 (the dense wire form fedhf counts)."""
        return Encoded({"values": x.to(torch.float32)}, tuple(x.shape))

    def decode(self, encoded: Encoded) -> torch.Tensor:
        return encoded.tensors["values"].to(torch.float64).reshape(encoded.shape)

    def spec(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.spec()


#: name -> factory taking the spec's argument string (None when the spec has no ``:arg``).
COMPRESSORS: Registry = Registry("compressor", "uplink_compression")


@COMPRESSORS.register("none")
def _none(arg: Optional[str]) -> Compressor:
    if arg is not None:
        raise ValueError(f"Compressor 'none' takes no argument, got {arg!r}.")
    return Compressor()


def build_compressor(spec: str) -> Compressor:
    """A compressor from ``"<name>"`` or ``"<name>:<arg>"`` (e.g. ``"int8"``, ``"topk:0.01"``, ``"powersgd:4"``)."""
    name, _, arg = spec.strip().partition(":")
    return COMPRESSORS.get(name.strip())(arg.strip() if arg else None)
