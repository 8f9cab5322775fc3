"""Robust aggregators: coordinate-wise median and trimmed mean (Yin et al., 2018, "Byzantine-Robust
Distributed Learning: Towards Optimal Statistical Rates").

Unlike every other server rule these are not functions of sums: they GATHER each participant's update
(``gathers = True``), so under multi-process runs the updates travel to every process instead of being
all-reduced, and memory grows with clients per round. Client weights are ignored (each client counts once),
which is what bounds the influence of a single client: with f adversaries among S participants, the median
moves only within the range of the honest values as long as f < S / 2, and the trimmed mean with
``trim_fraction`` >= f / S does the same.
"""

from __future__ import annotations

import torch

from ..core.context import ServerContext
from ..core.params import TensorDict
from .base import Aggregator


def coordinate_median(stacked: torch.Tensor) -> torch.Tensor:
    """Median over dim 0; for an even count, the mean of the two middle values."""
    ordered = stacked.sort(dim=0).values
    n = ordered.shape[0]
    return 0.5 * (ordered[(n - 1) // 2] + ordered[n // 2])


def trimmed_mean(stacked: torch.Tensor, trim_fraction: float) -> torch.Tensor:
    """Mean over dim 0 after dropping the floor(trim_fraction * n) largest and smallest values per coordinate."""
    n = stacked.shape[0]
    k = int(trim_fraction * n)
    if 2 * k >= n:
        raise ValueError(f"trim_fraction={trim_fraction} leaves no client of {n}; lower it or sample more clients.")
    return stacked.sort(dim=0).values[k:n - k].mean(dim=0)


class RobustAggregator(Aggregator):
    gathers = True

    def __init__(self, kind: str, trim_fraction: float = 0.1) -> None:
        if kind not in ("median", "trimmed_mean"):
            raise ValueError(f"Unknown robust aggregator {kind!r}; choose 'median' or 'trimmed_mean'.")
        if not 0.0 <= trim_fraction < 0.5:
            raise ValueError(f"`server_rule_kwargs.trim_fraction` must be in [0, 0.5), got {trim_fraction}.")
        self.name, self.kind, self.trim_fraction = kind, kind, float(trim_fraction)

    def aggregate(self, ctx: ServerContext) -> TensorDict:
        if not ctx.gathered:
            raise ValueError(f"The {self.kind} aggregator needs the gathered client updates (ServerContext.gathered).")
        out = {}
        for name, ref in ctx.global_params.items():
            stacked = torch.stack([delta[name] for delta in ctx.gathered])
            robust = coordinate_median(stacked) if self.kind == "median" else trimmed_mean(stacked, self.trim_fraction)
            out[name] = robust.to(ref.dtype)
        return out

    def __repr__(self) -> str:
        extra = f", trim_fraction={self.trim_fraction}" if self.kind == "trimmed_mean" else ""
        return f"RobustAggregator(kind={self.kind!r}{extra})"
