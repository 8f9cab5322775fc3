"""Client sampling: Poisson sampling lets each client in with probability q, independently, the same on every
process; fixed sampling is unchanged."""

from __future__ import annotations

import numpy as np

from fedhf.core.schedule import poisson_clients, round_clients, sample_clients


def test_poisson_inclusion_frequency_is_q():
    q, n, rounds = 0.1, 200, 2000
    counts = np.zeros(n)
    for r in range(rounds):
        counts[poisson_clients(0, r, n, q)] += 1
    # total inclusions ~ Binomial(4e5, 0.1): std 190; 6 stds -> a false failure below 1e-8
    assert abs(counts.sum() - q * n * rounds) < 6 * np.sqrt(n * rounds * q * (1 - q))
    assert counts.min() > 0  # every client is reachable
    sizes = {len(poisson_clients(0, r, n, q)) for r in range(50)}
    assert len(sizes) > 1  # the cohort size varies


def test_round_clients_dispatches_and_is_deterministic():
    assert round_clients(3, 2, 50, 5, "fixed") == sample_clients(3, 2, 50, 5)
    assert round_clients(3, 2, 50, 5, "poisson") == poisson_clients(3, 2, 50, 0.1)
    assert poisson_clients(3, 2, 50, 0.1) == poisson_clients(3, 2, 50, 0.1)
    assert poisson_clients(3, 2, 50, 0.1) != poisson_clients(3, 3, 50, 0.1)
