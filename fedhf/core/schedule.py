"""Seeds and schedules that depend only on (seed, round, client), never on how clients are spread over
processes, so a run is reproducible whatever runs it."""

from __future__ import annotations

import math

import numpy as np


def round_learning_rate(peak: float, round_index: int, num_rounds: int, schedule: str = "cosine") -> float:
    """eta_r = peak/2 (1 + cos(pi r / R)) for cosine (the papers': per round, constant inside a round)."""
    if schedule == "constant":
        return peak
    return 0.5 * peak * (1.0 + math.cos(math.pi * round_index / num_rounds))


def stream_seed(seed: int, *keys: int) -> int:
    """An independent 63-bit seed per (seed, keys...) stream, e.g. (seed, round, client)."""
    return int(np.random.SeedSequence([int(seed), *map(int, keys)]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def sample_clients(seed: int, round_index: int, num_clients: int, per_round: int) -> list:
    """Clients of a round, drawn uniformly without replacement, in draw order (a uniformly random order, so any
    prefix is a uniform random subset: parameter tracking's Y_r). Every process computes the same list."""
    rng = np.random.default_rng([int(seed), 0x5A3, int(round_index)])
    if per_round >= num_clients:
        return [int(c) for c in rng.permutation(num_clients)]
    return [int(c) for c in rng.choice(num_clients, size=per_round, replace=False)]


def poisson_clients(seed: int, round_index: int, num_clients: int, probability: float) -> list:
    """Clients of a round under Poisson sampling: each joins independently with ``probability`` (the sampling that
    privacy amplification by subsampling assumes), in client order; the cohort's size varies and may be 0."""
    rng = np.random.default_rng([int(seed), 0x9015, int(round_index)])
    return [int(c) for c in np.flatnonzero(rng.random(num_clients) < probability)]


def round_clients(seed: int, round_index: int, num_clients: int, per_round: int, sampling: str = "fixed") -> list:
    """The round's clients: ``fixed`` draws ``per_round`` without replacement (:func:`sample_clients`), ``poisson``
    lets each join with probability per_round / num_clients (:func:`poisson_clients`)."""
    if sampling == "poisson":
        return poisson_clients(seed, round_index, num_clients, per_round / num_clients)
    return sample_clients(seed, round_index, num_clients, per_round)
