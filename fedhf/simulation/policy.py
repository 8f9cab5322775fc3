"""Round policies on simulated time: which of the sampled clients a round keeps, and how long it lasts.

* :func:`wait_for_all`: the synchronous round every client is waited for (FedAvg as written); it lasts as long as
  its slowest client.
* :func:`deadline_round`: the server over-selects (:func:`over_selected`) and keeps the first ``target`` clients
  that report before the deadline; the rest are dropped and their work is wasted (Bonawitz et al., MLSys 2019,
  section 2: 130 % selection, a reporting deadline). It lasts until the target-th report, the deadline, or the
  last report, whichever is first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Dict, List, Sequence

import numpy as np

from .profile import ClientProfile

AVAILABILITY_STREAM = 0xA7A1


def client_seconds(profile: ClientProfile, tokens: float, uplink_bytes: float, downlink_bytes: float) -> float:
    """A client's round: receive the model, train on ``tokens``, send its message (one after another)."""
    return (downlink_bytes / profile.downlink_bytes_per_s + tokens / profile.tokens_per_s
            + uplink_bytes / profile.uplink_bytes_per_s)


def available_clients(seed: int, round_index: int, clients: Sequence[int],
                      profiles: Sequence[ClientProfile]) -> List[int]:
    """The sampled clients that are online this round, each independently with its availability; one draw per
    (seed, round, client), so the answer does not depend on which other clients were sampled."""
    online = []
    for cid in clients:
        draw = np.random.default_rng([int(seed), AVAILABILITY_STREAM, int(round_index), int(cid)]).random()
        if draw < profiles[cid].availability:
            online.append(cid)
    return online


@dataclass(frozen=True)
class RoundTiming:
    """A round on the clock: the clients whose messages enter the sums (in the order they were sampled), the
    round's simulated seconds, and the client-seconds spent by clients whose work was dropped."""

    kept: List[int]
    seconds: float
    wasted_seconds: float


def wait_for_all(finish: Dict[int, float]) -> RoundTiming:
    """Every client is kept; the round lasts as long as its slowest client (0 for an empty round)."""
    return RoundTiming(list(finish), max(finish.values(), default=0.0), 0.0)


def over_selected(target: int, over_selection: float, num_clients: int) -> int:
    """How many clients to sample for ``target`` reports: ceil((1 + over_selection) x target), at most every client.
    The product is exact (the fraction the setting is written as): in floats (1 + 0.1) x 100 is
    110.00000000000001, whose ceiling would sample, and account, 111 clients."""
    if over_selection <= 0:
        return target
    return min(num_clients, math.ceil((1 + Fraction(str(over_selection))) * target))


def deadline_round(finish: Dict[int, float], deadline_s: float, target: int) -> RoundTiming:
    """Keep the first ``target`` clients that finish within ``deadline_s``; ties go to the earlier-sampled client.
    A dropped client worked until it was cut off (the round's end) or until it finished, whichever came first."""
    order = sorted(finish, key=lambda c: (finish[c], list(finish).index(c)))
    on_time = [c for c in order if finish[c] <= deadline_s][:target]
    if len(on_time) == target:
        seconds = finish[on_time[-1]]
    elif len(on_time) == len(finish):
        seconds = max(finish.values(), default=0.0)
    else:
        seconds = deadline_s
    kept = set(on_time)
    wasted = sum(min(finish[c], seconds) for c in finish if c not in kept)
    return RoundTiming([c for c in finish if c in kept], seconds, wasted)
