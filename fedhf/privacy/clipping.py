"""Client-level clipping: every tensor a client sends is scaled by one factor so that their joint L2 norm is at
most C, which bounds one client's influence on the round's sums (the sensitivity of DP-FedAvg; McMahan et al.,
"Learning Differentially Private Recurrent Language Models", ICLR 2018, arXiv:1710.06963).

One joint factor (rather than one bound per part) keeps the ratios between the parts of a message: a state tensor
and the model delta it came with are shrunk together, and the bound C covers the whole message.

Adaptive clipping follows a target quantile gamma of the clients' norms (Andrew, Thakkar, McMahan, Ramaswamy,
"Differentially Private Learning with Adaptive Clipping", NeurIPS 2021, arXiv:1905.03871): each client reports
whether its norm was at most C as a centred bit, 1/2 or -1/2 (:func:`centred_bit`); the server unshifts the noisy
sum, b~ = (sum_i (b_i - 1/2) + noise) / S + 1/2, and updates C <- C exp(-eta (b~ - gamma)).
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Tuple

import torch


def joint_norm(tensors: Mapping[str, torch.Tensor]) -> float:
    """||(t_1, ..., t_k)||_2 over every tensor, in float64."""
    total = torch.zeros((), dtype=torch.float64)
    for t in tensors.values():
        total = total + t.detach().to(torch.float64).pow(2).sum().cpu()
    return float(total.sqrt())


def clip_jointly(tensors: Mapping[str, torch.Tensor], clip_norm: float) -> Tuple[Dict[str, torch.Tensor], float]:
    """(tensors scaled by min(1, C / norm), the norm before clipping). The scaled norm is <= C: the factor is
    computed in float64 and shrunk by one ulp-sized margin so that rounding never lands above C."""
    norm = joint_norm(tensors)
    if norm <= clip_norm or norm == 0.0:
        return {k: v.to(torch.float64) for k, v in tensors.items()}, norm
    factor = clip_norm / norm * (1.0 - 1e-12)
    return {k: v.to(torch.float64) * factor for k, v in tensors.items()}, norm


def centred_bit(norm: float, clip_norm: float) -> float:
    """What a client adds to the clipped count: [norm <= C] - 1/2, so that one client moves the sum by 1/2 (the
    sensitivity Andrew et al.'s noise split assumes; tensorflow_privacy's QuantileEstimatorQuery does the same)."""
    return float(norm <= clip_norm) - 0.5


def adaptive_clip_update(clip_norm: float, noisy_centred_sum: float, expected_clients: float, quantile: float,
                         learning_rate: float) -> float:
    """Andrew et al.'s geometric update: C exp(-eta (b~ - gamma)), with b~ the noisy fraction of clients whose
    norm was at most C: the noisy sum of centred bits over the expected cohort size, unshifted by 1/2 and clamped
    to [0, 1]."""
    fraction = min(max(noisy_centred_sum / expected_clients + 0.5, 0.0), 1.0)
    return clip_norm * math.exp(-learning_rate * (fraction - quantile))
