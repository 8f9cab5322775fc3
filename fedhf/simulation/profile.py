"""Client device profiles: how fast each client computes and communicates, and how often it is online.

Field measurements of phones and edge devices are heavy-tailed: the slowest clients are many times slower than the
median (Lai et al., "FedScale", ICML 2022, whose device traces span two orders of magnitude in compute and network
speed; Bonawitz et al., "Towards Federated Learning at Scale", MLSys 2019, on stragglers and availability). A
log-normal factor per client reproduces that shape with one parameter, the log-spread ``sigma``: sigma 0 gives every
client the median speed, sigma 1 puts the 95th-percentile-slow client 5.2x below the median. A CSV trace replaces the
model with measured devices.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import List

import numpy as np

MBPS = 1e6 / 8  # bytes per second in one megabit per second
PROFILE_STREAM = 0xC10C


@dataclass(frozen=True)
class ClientProfile:
    """One client's device: compute speed in tokens per second, link speeds in bytes per second, and the
    probability that it is online in a given round."""

    tokens_per_s: float
    uplink_bytes_per_s: float
    downlink_bytes_per_s: float
    availability: float = 1.0


def lognormal_profiles(num_clients: int, seed: int, tokens_per_s: float, uplink_mbps: float, downlink_mbps: float,
                       sigma: float, availability: float = 1.0) -> List[ClientProfile]:
    """Each client's compute and network speed are the medians times exp(sigma * N(0, 1)), with one independent
    factor for compute and one for the network (a slow phone is not always on a slow link). Seeded by ``seed``."""
    rng = np.random.default_rng([int(seed), PROFILE_STREAM])
    compute = np.exp(sigma * rng.standard_normal(num_clients))
    network = np.exp(sigma * rng.standard_normal(num_clients))
    return [ClientProfile(tokens_per_s * float(c), uplink_mbps * MBPS * float(n), downlink_mbps * MBPS * float(n),
                          availability) for c, n in zip(compute, network)]


COLUMNS = ("client_id", "tokens_per_s", "uplink_mbps", "downlink_mbps")


def csv_profiles(path: str, num_clients: int) -> List[ClientProfile]:
    """Profiles from a CSV trace with the columns ``client_id,tokens_per_s,uplink_mbps,downlink_mbps`` and an
    optional ``availability`` (a probability, default 1), one row per client 0..num_clients-1."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    missing = [c for c in COLUMNS if rows and c not in rows[0]] if rows else list(COLUMNS)
    if missing:
        raise ValueError(f"The clock trace {path} lacks the column(s) {missing}: it needs {', '.join(COLUMNS)} "
                         "(and optionally availability), one row per client.")
    profiles = {}
    for line, row in enumerate(rows, start=2):
        try:
            cid = int(row["client_id"])
            values = [float(row[c]) for c in COLUMNS[1:]] + [float(row.get("availability") or 1.0)]
        except ValueError as err:
            raise ValueError(f"The clock trace {path}, line {line}: {err}.") from None
        if not all(math.isfinite(v) and v > 0 for v in values) or values[3] > 1:
            raise ValueError(f"The clock trace {path}, line {line}: speeds must be positive and availability in "
                             f"(0, 1], got {row}.")
        profiles[cid] = ClientProfile(values[0], values[1] * MBPS, values[2] * MBPS, values[3])
    absent = sorted(set(range(num_clients)) - set(profiles))
    if absent:
        raise ValueError(f"The clock trace {path} has no row for client(s) {absent[:10]} of num_clients="
                         f"{num_clients}: give one row per client.")
    return [profiles[c] for c in range(num_clients)]
