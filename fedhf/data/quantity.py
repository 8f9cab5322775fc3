"""Quantity skew: client sizes that follow a power law, alone (IID rows) or with a Dirichlet mix over a key.

Real federations are unbalanced: a few clients hold most of the data (Li et al., "Federated Learning on Non-IID
Data Silos: An Experimental Study", ICDE 2022, which names quantity skew as its own non-IID axis). Here client i
(0-based) gets ``m + share_i`` rows, m = ``min_partition_size``, where the N*m guaranteed rows are set aside and
the rest is shared out in proportion to the Zipf weights (i + 1) ** -s, s = ``quantity_skew`` (s = 0: equal
sizes; s = 1: client 0 holds about twice client 1's rows and N times client N-1's). Client 0 is the largest.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np


def power_law_sizes(num_rows: int, num_clients: int, exponent: float, min_size: int = 1) -> np.ndarray:
    """Integer sizes summing to ``num_rows``: ``min_size`` each plus the rest in proportion to (i+1)^-exponent,
    rounded by largest remainder (ties to the lower client id)."""
    if num_clients < 1 or min_size * num_clients > num_rows:
        raise ValueError(
            f"`min_partition_size`={min_size} x `num_clients`={num_clients} exceeds the {num_rows} rows; lower "
            "one of them."
        )
    weights = np.arange(1, num_clients + 1, dtype=float) ** -float(exponent)
    spare = num_rows - num_clients * min_size
    exact = spare * weights / weights.sum()
    sizes = np.floor(exact).astype(np.int64)
    by_remainder = np.argsort(-(exact - sizes), kind="stable")
    sizes[by_remainder[: spare - int(sizes.sum())]] += 1
    return sizes + min_size


def sized_iid_partition(sizes: Sequence[int], seed: int) -> List[np.ndarray]:
    """A random permutation of sum(sizes) rows cut into consecutive parts of the given sizes."""
    order = np.random.default_rng(seed).permutation(int(np.sum(sizes)))
    return [np.sort(part) for part in np.split(order, np.cumsum(sizes)[:-1])]


def sized_dirichlet_partition(codes: Sequence[int], sizes: Sequence[int], alpha: float, seed: int) -> List[np.ndarray]:
    """Client i gets exactly sizes[i] rows, drawn by key value from its own mix p_i ~ Dir(alpha * 1_K).

    With sizes fixed, the Dirichlet is drawn per client over the K key values (the unbalanced split of Acar et al.,
    "Federated Learning Based on Dynamic Regularization" (FedDyn), ICLR 2021, and FedLab's
    ``client_inner_dirichlet_partition``) rather than per key value over clients as in the unsized split. Clients
    are filled in a seeded random order; a key value that runs out is dropped from the later clients' mixes
    (renormalised), so at very small alpha the last clients' mixes are less extreme than drawn.
    """
    codes = np.asarray(codes)
    if int(np.sum(sizes)) != len(codes):
        raise ValueError(f"The client sizes sum to {int(np.sum(sizes))} but there are {len(codes)} rows.")
    rng = np.random.default_rng(seed)
    values = np.unique(codes)
    pools = [rng.permutation(np.flatnonzero(codes == v)) for v in values]
    left = np.array([len(p) for p in pools], dtype=np.int64)
    mixes = rng.dirichlet(np.full(len(values), alpha), size=len(sizes))
    parts: List[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(sizes)
    for client in rng.permutation(len(sizes)):
        counts = _draw_counts(int(sizes[client]), mixes[client], left, rng)
        taken = [pool[len(pool) - remaining: len(pool) - remaining + n]
                 for pool, remaining, n in zip(pools, left, counts)]
        parts[client] = np.sort(np.concatenate(taken)).astype(np.int64)
        left -= counts
    return parts


def _draw_counts(need: int, mix: np.ndarray, left: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """How many rows of each key value a client of ``need`` rows takes: multinomial draws from its mix, capped by
    what is left, redrawn for the shortfall over the values still available until the client is full."""
    counts = np.zeros_like(left)
    while need > 0:
        room = left - counts
        weights = np.where(room > 0, mix, 0.0)
        if weights.sum() <= 0:  # the client's mix has no mass on what is left: take the rest uniformly
            weights = (room > 0).astype(float)
        draw = np.minimum(rng.multinomial(need, weights / weights.sum()), room)
        counts += draw
        need -= int(draw.sum())
    return counts
