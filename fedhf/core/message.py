"""A client's message as a value: what one component (the trainer, the correction, the state sync, the server
rule's client half) sends for one client round.

Each component's client half *returns* a :class:`Message`; the trainer namespaces it by the component
(``correction.dc.<param>``, ``sync.theta.<key>``, ``server.P.<weight>``) and adds it into the round's
:class:`fedhf.core.sums.RoundSums`, so no component writes into state it shares with another. Tensors are
added as given: a component scales by its client weight w_i itself when its server half wants a weighted sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

import torch

from .params import num_bytes


@dataclass
class Message:
    tensors: Dict[str, torch.Tensor] = field(default_factory=dict)  # named tensors (or 0-d scalars), summed
    nbytes: int = 0  # what would go over the wire for them (the uplink the trainer reports)
    # The keys counted at their dense size, with the dtype they are sent in: what a compressor may re-encode
    # (a tensor put with a declared byte count -- low-rank, a triangle, a 0-byte diagnostic -- has its own form).
    dense: Dict[str, torch.dtype] = field(default_factory=dict)

    def put(self, prefix: str, tensors: Mapping[str, torch.Tensor], scale: float = 1.0,
            nbytes: Optional[int] = None) -> "Message":
        """Send ``scale * tensors`` as ``<prefix>.<name>``. Their dense bytes count, or ``nbytes`` when what would
        be sent is smaller (a low-rank factorisation, a triangle; 0 for a diagnostic a deployment would not send)."""
        for name, tensor in tensors.items():
            value = tensor.detach().to(torch.float64)  # the sums are float64; scaled after the cast, as before
            self.tensors[f"{prefix}.{name}"] = value * scale if scale != 1.0 else value
            if nbytes is None:
                self.dense[f"{prefix}.{name}"] = tensor.dtype
        self.nbytes += num_bytes(tensors) if nbytes is None else int(nbytes)
        return self

    def put_scalar(self, key: str, value: float) -> "Message":
        """A count or weight (not counted as upload: it rides along with the tensors)."""
        self.tensors[key] = torch.as_tensor(float(value), dtype=torch.float64)
        return self

    def __bool__(self) -> bool:
        return bool(self.tensors)
