"""Secure aggregation, simulated with its real numerics (SecAgg: Bonawitz et al., "Practical Secure Aggregation
for Privacy-Preserving Machine Learning", CCS 2017; SecAgg+: Bell, Bonawitz, Gascon, Lepoint, Raykova, CCS 2020).

A client's vector is clamped to [-c, c], stochastically quantised to b bits (unbiased: rounded up with probability
equal to the fraction), and read as integers in Z_{2^32}. Double masking, as SecAgg's: each pair of clients (i, j)
of the round derives one pseudo-random mask stream from a seed they share; i adds the masks and j subtracts them,
mod 2^32, so they cancel in the sum; and each client adds a self mask from a seed b_i of its own. The recovery
(:meth:`SecAggCodec.remove_dropped`) asks the survivors, for every client of the round, for exactly one of two
secrets: a survivor's b_i (its self mask is removed from the sum) or a dropped client's pair seeds (the masks it
shared with the survivors are removed), never both for one client. So a client declared dropped whose masked
upload arrives late stays hidden by its self mask: the server, holding its pair seeds, cannot unmask it alone.
SecAgg reconstructs those secrets from the survivors' Shamir shares; here the server regenerates them from the
seeds. Decoding needs sum_i q_i < 2^32 (``max_clients``), which the trainer checks before any work.

The pair seed stands in for the key agreement (Diffie-Hellman in SecAgg): the codec's ``seed`` is the run's privacy
secret (fedhf/privacy/secret.py: drawn from the operating system's entropy, kept in the server's checkpoint), not
the published ``seed``.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Mapping, Sequence, Tuple

import torch

from ..core.schedule import stream_seed

MODULUS = 2 ** 32
MASK_STREAM = 0x5EC  # the pair masks' stream tag
SELF_STREAM = 0x5EE  # the self masks' stream tag
ROUND_STREAM = 0x5ED  # the stochastic rounding's stream tag


class SecAggCodec:
    """Fixed-point encoding to ``bits`` bits over [-clip_range, clip_range], masks mod 2^32, decoding of sums."""

    def __init__(self, bits: int, clip_range: float, seed: int) -> None:
        if not 1 <= bits <= 31:
            raise ValueError(f"secagg_bits must be in [1, 31], got {bits}")
        self.bits, self.clip_range, self.seed = int(bits), float(clip_range), int(seed)
        self.levels = 2 ** self.bits - 1

    @property
    def max_clients(self) -> int:
        """The most summands whose quantised sum stays below 2^32 (decodable)."""
        return (MODULUS - 1) // self.levels

    @property
    def step(self) -> float:
        return 2.0 * self.clip_range / self.levels

    def out_of_range(self, tensors: Mapping[str, torch.Tensor]) -> Tuple[int, float]:
        """(how many elements :meth:`quantise` would clamp by more than half a step, the largest |element|)."""
        outside, largest = 0, 0.0
        for x in tensors.values():
            magnitude = x.detach().abs()
            outside += int((magnitude > self.clip_range + self.step / 2).sum())  # less: within a rounding step
            largest = max(largest, float(magnitude.max())) if magnitude.numel() else largest
        return outside, largest

    def quantise(self, tensors: Mapping[str, torch.Tensor], round_index: int, client: int) -> Dict[str, torch.Tensor]:
        """Each value clamped to [-c, c] and rounded to one of 2^b levels, unbiasedly, with the client's own stream
        (keys in sorted order); int64 in [0, 2^b - 1]."""
        generator = torch.Generator().manual_seed(stream_seed(self.seed, ROUND_STREAM, round_index, client))
        out = {}
        for key in sorted(tensors):
            x = tensors[key].detach().to(torch.float64).cpu().clamp(-self.clip_range, self.clip_range)
            scaled = (x + self.clip_range) / self.step
            low = scaled.floor()
            up = torch.rand(x.shape, generator=generator, dtype=torch.float64) < (scaled - low)
            out[key] = (low + up.to(torch.float64)).clamp(0, self.levels).to(torch.int64)
        return out

    def pair_masks(self, round_index: int, i: int, j: int, shapes: Mapping[str, torch.Size]) -> Dict[str, torch.Tensor]:
        """The masks of pair {i, j} this round (the same for both), one per key in sorted order."""
        low, high = min(i, j), max(i, j)
        generator = torch.Generator().manual_seed(stream_seed(self.seed, MASK_STREAM, round_index, low, high))
        return {key: torch.randint(0, MODULUS, tuple(shapes[key]), generator=generator, dtype=torch.int64)
                for key in sorted(shapes)}

    def self_mask(self, round_index: int, client: int, shapes: Mapping[str, torch.Size]) -> Dict[str, torch.Tensor]:
        """The client's own mask this round, PRG(b_i), one per key in sorted order."""
        generator = torch.Generator().manual_seed(stream_seed(self.seed, SELF_STREAM, round_index, client))
        return {key: torch.randint(0, MODULUS, tuple(shapes[key]), generator=generator, dtype=torch.int64)
                for key in sorted(shapes)}

    def mask(self, encoded: Mapping[str, torch.Tensor], round_index: int, client: int,
             cohort: Iterable[int]) -> Dict[str, torch.Tensor]:
        """q_i + PRG(b_i) + sum_{j > i} m_ij - sum_{j < i} m_ij mod 2^32, over the round's other clients j."""
        shapes = {k: v.shape for k, v in encoded.items()}
        own = self.self_mask(round_index, client, shapes)
        out = {k: (v + own[k]) % MODULUS for k, v in encoded.items()}
        for other in cohort:
            if other == client:
                continue
            sign = 1 if client < other else -1
            for key, m in self.pair_masks(round_index, client, other, shapes).items():
                out[key] = (out[key] + sign * m) % MODULUS
        return out

    def remove_dropped(self, total: Mapping[str, torch.Tensor], round_index: int, survivors: Sequence[int],
                       dropped: Sequence[int]) -> Dict[str, torch.Tensor]:
        """The survivors' sum unmasked (SecAgg's recovery): each survivor's self mask and the masks each survivor
        shared with a dropped client are taken out. A client is either a survivor (its b_i is revealed) or dropped
        (its pair seeds are), never both: a late upload of a dropped client keeps its self mask."""
        both = set(survivors) & set(dropped)
        if both:
            raise ValueError(f"clients {sorted(both)} are both survivors and dropped: revealing both their self-mask "
                             "seed and their pair seeds would unmask their upload alone")
        shapes = {k: v.shape for k, v in total.items()}
        out = {k: v.clone() % MODULUS for k, v in total.items()}
        for s in survivors:
            for key, m in self.self_mask(round_index, s, shapes).items():
                out[key] = (out[key] - m) % MODULUS
        for s in survivors:
            for d in dropped:
                sign = 1 if s < d else -1
                for key, m in self.pair_masks(round_index, s, d, shapes).items():
                    out[key] = (out[key] - sign * m) % MODULUS
        return out

    def decode(self, total: Mapping[str, torch.Tensor], count: int) -> Dict[str, torch.Tensor]:
        """sum_i x_i from sum_i q_i (mod 2^32, below 2^32 when ``count`` <= max_clients): sum q * step - count c."""
        return {k: (v % MODULUS).to(torch.float64) * self.step - count * self.clip_range for k, v in total.items()}


def masked_bytes(shapes: Mapping[str, torch.Size], partners: int) -> int:
    """What one client uploads: every masked element as a 32-bit word (the sum lives in Z_{2^32}), plus the key
    agreement and secret shares per partner, estimated as SecAgg's two 32-byte public keys and two encrypted
    48-byte shares."""
    return 4 * sum(math.prod(s) for s in shapes.values()) + partners * (2 * 32 + 2 * 48)
