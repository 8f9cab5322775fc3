"""Held-out rows per client: a seeded fraction of each client's rows kept apart as that client's own evaluation
set (the personalised evaluation of pFedMe/Ditto-style papers: each client's model on its own unseen rows).
The rows held out are never trained on; the rest is the client's training partition."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

# A stream of its own, so that holding rows out never changes which rows each client got.
_HOLDOUT_STREAM = 13


def held_out_count(num_rows: int, fraction: float) -> int:
    """round(fraction * num_rows), at least 1 when fraction > 0 (a client with no rows to evaluate on is useless)."""
    return 0 if fraction <= 0 else max(1, round(fraction * num_rows))


def hold_out(parts: Sequence[np.ndarray], fraction: float, seed: int) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """(training rows, held-out rows) per client; both sorted, disjoint, and together the client's rows."""
    rng = np.random.default_rng([seed, _HOLDOUT_STREAM])
    train, held = [], []
    for client, rows in enumerate(parts):
        rows = np.asarray(rows, dtype=np.int64)
        k = held_out_count(len(rows), fraction)
        if k >= len(rows):
            raise ValueError(
                f"Client {client} has {len(rows)} row(s): `client_eval_fraction`={fraction} would hold out {k} and "
                "leave none to train on. Raise `min_partition_size`, lower `client_eval_fraction` or `num_clients`."
            )
        chosen = np.zeros(len(rows), dtype=bool)
        chosen[rng.choice(len(rows), size=k, replace=False)] = True
        train.append(np.sort(rows[~chosen]))
        held.append(np.sort(rows[chosen]))
    return train, held
