"""The round policies as objects, one class per ``round_policy`` value, in the registry :data:`ROUND_POLICIES`.

A policy answers what the simulated clock asks of a round (fedhf/trainer/hooks/clock.py, a thin adapter: it keeps
the clock's state, times the clients and applies the answers to the run):

* :meth:`RoundPolicy.sample_size`: how many clients the loop samples for a round that aims at ``target`` reports
  (the cohort the privacy accountant's event has; the deadline policy over-selects);
* :meth:`RoundPolicy.close_round`: which of the clients training towards this server update enter it, how long the
  round lasts on simulated time, and the client-seconds of dropped work;
* :attr:`RoundPolicy.buffered`, :meth:`RoundPolicy.concurrency` and :meth:`RoundPolicy.report_weight`: whether
  clients train across server updates (their reports held until they arrive, FedBuff), how many train at once, and
  how much a report that is ``staleness`` updates old weighs.

The math is the pure functions of policy.py and buffered.py; the classes only pick theirs. A new policy is its class
here, its line in :data:`ROUND_POLICIES` (which makes it a ``round_policy`` choice) and its entry in the conformance
suite (tests/simulation/test_round_policy_conformance.py); docs/clock.md, "Adding a round policy".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Type

from .buffered import buffered_round, staleness_weight
from .policy import RoundTiming, deadline_round, over_selected, wait_for_all


@dataclass(frozen=True)
class RoundSetup:
    """What a policy reads of the run's settings (built from the config by
    fedhf/trainer/config/clock_policy.py)."""

    clients_per_round: int  # the reports a round aims for (FedBuff: the buffer)
    num_clients: int
    report_cap: int  # the most reports a synchronous round keeps: clients_per_round, or every one under DP Poisson
    deadline_s: Optional[float] = None  # deadline: the reporting deadline, simulated seconds
    over_selection: float = 0.0  # deadline: sample (1 + this) x clients_per_round
    async_concurrency: Optional[int] = None  # fedbuff: clients training at once; None: 2 x clients_per_round


class RoundPolicy(ABC):
    """One ``round_policy``: a thin object over the pure functions of policy.py and buffered.py."""

    # False: a round's clients begin together from the current model and report within it. True: clients train
    # across server updates, each from the model of its dispatch; the clock holds their reports until they arrive.
    buffered: ClassVar[bool] = False

    def __init__(self, setup: RoundSetup) -> None:
        self.setup = setup

    def sample_size(self, target: int) -> int:
        """How many clients the loop samples for a round that aims at ``target`` reports (clients_per_round, or what
        the round hooks before the clock answered): ``target``, or more for a policy that over-selects (>= target
        unless there are fewer clients)."""
        return target

    def concurrency(self) -> int:
        """How many clients train at once: a synchronous round's sample."""
        return self.sample_size(self.setup.clients_per_round)

    def clients_started(self, num_rounds: int) -> int:
        """The most client trainings ``num_rounds`` server updates start (the memory plan bounds the clients whose
        state is stored by it): every round's sample, dropped ones included."""
        return self.concurrency() * num_rounds

    @abstractmethod
    def close_round(self, finish: Dict[int, float], now: float) -> RoundTiming:
        """The round's server update. ``finish``: each client training towards it (in the order they began) and the
        simulated second it reports; ``now``: when the round began, on the same clock (a synchronous round's clients
        all begin at ``now``). Returns the clients whose reports enter the update, in the order they enter the sums,
        the round's seconds after ``now`` and the client-seconds of dropped work."""

    def report_weight(self, staleness: int) -> float:
        """The weight of a report's model change that is ``staleness`` server updates old (1: a synchronous round
        has no stale reports)."""
        return 1.0


def _since(finish: Dict[int, float], now: float) -> Dict[int, float]:
    """The reports' times from the round's start (exact for now = 0: t - 0.0 is t)."""
    return {c: t - now for c, t in finish.items()}


class WaitForAll(RoundPolicy):
    """``wait_all``: every online sampled client is kept; the round lasts as long as the slowest."""

    def close_round(self, finish: Dict[int, float], now: float) -> RoundTiming:
        return wait_for_all(_since(finish, now))


class Deadline(RoundPolicy):
    """``deadline``: over-select, keep the first ``report_cap`` reports within the deadline, drop the rest
    (Bonawitz et al., MLSys 2019)."""

    def sample_size(self, target: int) -> int:
        return over_selected(target, self.setup.over_selection, self.setup.num_clients)

    def close_round(self, finish: Dict[int, float], now: float) -> RoundTiming:
        return deadline_round(_since(finish, now), self.setup.deadline_s, self.setup.report_cap)


class FedBuff(RoundPolicy):
    """``fedbuff``: ``concurrency`` clients always training, a server update after every clients_per_round reports,
    stale changes weighted by 1/sqrt(1 + staleness) (Nguyen et al., AISTATS 2022)."""

    buffered = True

    def concurrency(self) -> int:
        s = self.setup
        wanted = s.async_concurrency if s.async_concurrency is not None else 2 * s.clients_per_round
        return min(s.num_clients, wanted)

    def clients_started(self, num_rounds: int) -> int:
        # the first ``concurrency`` clients, then one more after every report; the run ends after num_rounds
        # buffers of clients_per_round reports
        return self.concurrency() + num_rounds * self.setup.clients_per_round

    def close_round(self, finish: Dict[int, float], now: float) -> RoundTiming:
        return buffered_round(finish, now, self.setup.clients_per_round)

    def report_weight(self, staleness: int) -> float:
        return staleness_weight(staleness)


# round_policy -> its class; the keys, in this order, are the setting's choices (fedhf/trainer/config/clock_settings.py)
ROUND_POLICIES: Dict[str, Type[RoundPolicy]] = {"wait_all": WaitForAll, "deadline": Deadline, "fedbuff": FedBuff}
