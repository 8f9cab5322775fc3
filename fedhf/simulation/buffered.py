"""Buffered asynchronous aggregation on simulated time (FedBuff: Nguyen et al., "Federated Learning with Buffered
Asynchronous Aggregation", AISTATS 2022).

The server keeps ``concurrency`` clients training at all times. Each starts from the global model of the moment it
is dispatched (its version) and reports when its device finishes. The server waits for ``buffer`` reports, then
updates the model with the mean of their changes, each weighted by its staleness s (server updates since the
client's version): alpha(s) = 1 / sqrt(1 + s), the paper's choice. Then it dispatches new clients to refill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence

from .policy import RoundTiming


def staleness_weight(staleness: int) -> float:
    """alpha(s) = (1 + s)^(-1/2): a fresh report counts fully, one three updates old half."""
    return 1.0 / math.sqrt(1.0 + staleness)


@dataclass
class InFlight:
    """A dispatched client: its id, the model version it started from, and when (simulated seconds) it reports."""

    client: int
    version: int
    finish: float


def next_arrivals(in_flight: Sequence[InFlight], buffer: int) -> List[InFlight]:
    """The ``buffer`` reports that come first (ties: the earlier dispatched)."""
    order = sorted(range(len(in_flight)), key=lambda i: (in_flight[i].finish, i))
    return [in_flight[i] for i in order[:buffer]]


def refill(candidates: Sequence[int], busy: Sequence[int], free_slots: int) -> List[int]:
    """The next ``free_slots`` clients of ``candidates`` (a seeded order) that are not already training."""
    taken = set(busy)
    return [c for c in candidates if c not in taken][:max(free_slots, 0)]


def buffered_round(finish: Dict[int, float], now: float, buffer: int) -> RoundTiming:
    """The server update ``now`` waits for: the first ``buffer`` reports of the clients in flight (``finish``: each
    one's report time on the run's clock, in dispatch order; ties: the earlier dispatched), in the order they arrive.
    It happens at the last of them, or ``now`` when they all arrived before (reports wait for the update); no
    work is dropped."""
    clients = list(finish)
    order = sorted(range(len(clients)), key=lambda i: (finish[clients[i]], i))  # as next_arrivals
    arrived = [clients[i] for i in order[:buffer]]
    end = max([now] + [finish[c] for c in arrived])
    return RoundTiming(arrived, end - now, 0.0)
