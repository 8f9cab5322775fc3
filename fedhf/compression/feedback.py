"""Error feedback: what compression dropped is added to the next message (EF-SGD: Seide et al., "1-bit SGD",
Interspeech 2014; Karimireddy et al., "Error Feedback Fixes SignSGD", ICML 2019, arXiv:1901.09847; EF21:
Richtarik et al., NeurIPS 2021, arXiv:2106.05203).

One step, pure: with residual e (zero at first) and the message x,

    c = x + e,   sent = decode(encode(c)),   e' = c - sent.

So over rounds sum_t sent_t + e_T = sum_t x_t (a telescoping sum): nothing is lost, only delayed. Without
feedback e stays zero and an unbiased compressor's error averages out over clients instead.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .base import Compressor, Encoded


def compress_step(x: torch.Tensor, residual: Optional[torch.Tensor], compressor: Compressor,
                  generator: torch.Generator, state: Optional[torch.Tensor] = None,
                  feedback: bool = True) -> Tuple[torch.Tensor, Optional[torch.Tensor], Encoded]:
    """(what the receiver decodes, the new residual (None without feedback), the encoding) of one tensor, float64."""
    corrected = x.to(torch.float64)
    if feedback and residual is not None:
        corrected = corrected + residual.to(torch.float64)
    encoded = compressor.encode(corrected, generator, state)
    sent = compressor.decode(encoded)
    return sent, (corrected - sent) if feedback else None, encoded
