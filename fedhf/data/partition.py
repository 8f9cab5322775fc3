"""Split a ``datasets.Dataset`` over simulated clients. Every partitioner returns one sorted index array per
client; together they cover every row exactly once, and the same seed gives the same split.

* ``dirichlet``: label skew over any categorical column. For each class, its rows are shared out by
  proportions q ~ Dir(alpha * 1_N); alpha -> 0 gives each client few classes, alpha -> inf approaches IID
  (Hsu et al., 2019; the split every seed paper uses). A split in which some client has fewer than
  ``min_partition_size`` rows is redrawn, up to ``max_retries`` times.
* ``iid``: a random permutation cut into near-equal parts.
* ``natural``: one client per distinct value of a column (a user id, a writer, a hospital).
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

PARTITIONERS = ("dirichlet", "iid", "natural")


def iid_partition(num_rows: int, num_clients: int, seed: int) -> List[np.ndarray]:
    _check_clients(num_rows, num_clients)
    order = np.random.default_rng(seed).permutation(num_rows)
    return [np.sort(part) for part in np.array_split(order, num_clients)]


def dirichlet_partition(
    labels: Sequence,
    num_clients: int,
    alpha: float,
    seed: int,
    min_partition_size: int = 1,
    max_retries: int = 100,
) -> List[np.ndarray]:
    if not alpha > 0:
        raise ValueError(f"`dirichlet_alpha` must be > 0 (got {alpha}); small values such as 0.1 give strong skew.")
    labels = np.asarray(labels)
    _check_clients(len(labels), num_clients)
    if min_partition_size * num_clients > len(labels):
        raise ValueError(
            f"`min_partition_size`={min_partition_size} x `num_clients`={num_clients} exceeds the {len(labels)} rows; "
            "lower one of them."
        )
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == c) for c in classes]
    smallest = 0
    for _ in range(max_retries):
        parts: List[list] = [[] for _ in range(num_clients)]
        for rows in by_class:
            rows = rng.permutation(rows)
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(rows)).astype(int)
            for client, chunk in enumerate(np.split(rows, cuts)):
                parts[client].extend(chunk.tolist())
        smallest = min(len(p) for p in parts)
        if smallest >= min_partition_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ValueError(
        f"Could not draw a Dirichlet(alpha={alpha}) split of {len(labels)} rows over {num_clients} clients with at "
        f"least `min_partition_size`={min_partition_size} rows each in {max_retries} tries (the smallest client "
        f"had {smallest}). Raise `dirichlet_alpha`, lower `num_clients` or `min_partition_size`, or raise "
        "`partition_max_retries`."
    )


def natural_partition(values: Sequence, num_clients: int) -> List[np.ndarray]:
    values = np.asarray(values)
    distinct = np.unique(values)
    if len(distinct) != num_clients:
        raise ValueError(
            f"The `natural` partition makes one client per distinct value, and the column has {len(distinct)} "
            f"values but `num_clients`={num_clients}; set `num_clients={len(distinct)}`."
        )
    return [np.flatnonzero(values == v).astype(np.int64) for v in distinct]


def _check_clients(num_rows: int, num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"`num_clients` must be >= 1, got {num_clients}.")
    if num_clients > num_rows:
        raise ValueError(
            f"`num_clients`={num_clients} is more than the {num_rows} training rows; every client needs data. "
            "Lower `num_clients` or use more data."
        )
