"""Every round policy of the registry (fedhf/simulation/rounds.py) against the interface and a hand computation.

Each entry of ``ROUND_POLICIES`` needs a case here (a new policy without one fails the first test): its settings,
the clients training towards one server update on a tiny profile, and the answers worked out by hand. The
parametrised tests then check what every policy owes the clock hook: the sample holds at least clients_per_round,
the kept clients are distinct clients of those training, the round lasts until its last kept report and equals the
hand computation, the answers do not depend on where the clock's zero is, and the same inputs give the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Dict, List

import pytest
import torch

from fedhf import FederatedConfig
from fedhf.simulation import ROUND_POLICIES, ClientProfile, RoundPolicy, RoundSetup, client_seconds, lognormal_profiles
from fedhf.trainer.config import clock_settings

# four devices that differ only in compute: a client's round is 80/40 s down + 100 tokens / speed + 20/10 s up
TINY = [ClientProfile(100.0, 10.0, 40.0), ClientProfile(50.0, 10.0, 40.0), ClientProfile(25.0, 10.0, 40.0),
        ClientProfile(200.0, 10.0, 40.0)]
SECONDS = [client_seconds(p, tokens=100.0, uplink_bytes=20.0, downlink_bytes=80.0) for p in TINY]


@dataclass(frozen=True)
class Case:
    setup: RoundSetup
    finish: Dict[int, float]  # the clients training towards the update, in the order they began -> report second
    now: float  # when the round began
    sample_size: int
    concurrency: int
    kept: List[int]
    seconds: float
    wasted: float
    weight_3: float = 1.0  # the weight of a report 3 server updates old


CASES = {
    # 2 sampled clients, both kept; the round is the slower's 2 + 4 + 2 = 8 s
    "wait_all": Case(RoundSetup(2, 4, report_cap=2), {2: SECONDS[2], 0: SECONDS[0]}, 0.0,
                     sample_size=2, concurrency=2, kept=[2, 0], seconds=8.0, wasted=0.0),
    # ceil(1.5 x 2) = 3 sampled; 3 (4.5 s) and 0 (5 s) beat the 5.5 s deadline, the round ends at the 2nd report,
    # client 1 (6 s) worked until then: 5 s wasted
    "deadline": Case(RoundSetup(2, 4, report_cap=2, deadline_s=5.5, over_selection=0.5),
                     {1: SECONDS[1], 3: SECONDS[3], 0: SECONDS[0]}, 0.0,
                     sample_size=3, concurrency=3, kept=[3, 0], seconds=5.0, wasted=5.0),
    # 4 in flight (default concurrency 2 x 2), dispatched at 0, 0, 2 and 3 s; at 3 s the update waits for the first 2
    # reports, 1 (at 6 s) and 0 (at 7 s): 4 s later; a report 3 updates old weighs 1 / sqrt(1 + 3)
    "fedbuff": Case(RoundSetup(2, 4, report_cap=2), {2: 0.0 + SECONDS[2], 1: 0.0 + SECONDS[1],
                                                     0: 2.0 + SECONDS[0], 3: 3.0 + SECONDS[3]}, 3.0,
                    sample_size=2, concurrency=4, kept=[1, 0], seconds=4.0, wasted=0.0, weight_3=0.5),
}
NAMES = list(ROUND_POLICIES)


def test_the_tiny_profile_is_what_the_cases_assume():
    assert SECONDS == [5.0, 6.0, 8.0, 4.5]


def test_every_policy_has_a_case_and_is_a_round_policy_choice():
    assert set(CASES) == set(ROUND_POLICIES)
    assert list(ROUND_POLICIES) == list(clock_settings.ROUND_POLICIES)  # the setting's choices, in order
    help_text = clock_settings.ClockSettings.__dataclass_fields__["round_policy"].metadata["help"]
    assert all(f"'{name}'" in help_text for name in ROUND_POLICIES)  # each choice explained in --help
    assert clock_settings.ClockSettings.round_policy in ROUND_POLICIES  # the default is one of them


@pytest.mark.parametrize("name", NAMES)
def test_each_entry_is_a_round_policy_with_a_declared_mode(name):
    policy = ROUND_POLICIES[name](CASES[name].setup)
    assert isinstance(policy, RoundPolicy) and type(policy).__module__ == "fedhf.simulation.rounds"
    assert isinstance(policy.buffered, bool)


@pytest.mark.parametrize("name", NAMES)
def test_the_sample_is_at_least_the_target_and_at_most_every_client(name):
    case = CASES[name]
    policy, target = ROUND_POLICIES[name](case.setup), case.setup.clients_per_round
    assert policy.sample_size(target) == case.sample_size
    assert target <= policy.sample_size(target) <= case.setup.num_clients
    assert policy.concurrency() == case.concurrency
    assert policy.concurrency() >= (target if policy.buffered else policy.sample_size(target))
    crowded = ROUND_POLICIES[name](replace(case.setup, num_clients=target))
    assert crowded.sample_size(target) == crowded.concurrency() == target  # no client twice
    assert target - 1 <= policy.sample_size(target - 1) <= policy.sample_size(target)  # a smaller target, no more


@pytest.mark.parametrize("name", NAMES)
def test_the_round_keeps_training_clients_and_lasts_the_hand_computed_time(name):
    case = CASES[name]
    timing = ROUND_POLICIES[name](case.setup).close_round(dict(case.finish), case.now)
    assert timing.kept == case.kept
    assert len(set(timing.kept)) == len(timing.kept) and set(timing.kept) <= set(case.finish)
    assert len(timing.kept) <= case.setup.report_cap
    assert timing.seconds == case.seconds and timing.wasted_seconds == case.wasted
    assert case.now + timing.seconds >= max(case.finish[c] for c in timing.kept)  # no report after the update


@pytest.mark.parametrize("name", NAMES)
def test_the_answers_do_not_depend_on_where_the_clock_starts(name):
    case = CASES[name]
    shift = 1024.0  # a power of two: every shifted time is exact
    moved = ROUND_POLICIES[name](case.setup).close_round({c: t + shift for c, t in case.finish.items()},
                                                         case.now + shift)
    assert ROUND_POLICIES[name](case.setup).close_round(dict(case.finish), case.now) == moved


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_round_and_an_empty_round_takes_no_time(name):
    case = CASES[name]
    devices = lognormal_profiles(12, seed=7, tokens_per_s=100.0, uplink_mbps=1.0, downlink_mbps=4.0, sigma=1.0)
    finish = {c: client_seconds(devices[c], 300.0, 1e5, 1e5) for c in (5, 0, 9, 3, 11, 2)}
    setup = replace(case.setup, num_clients=12, deadline_s=None if case.setup.deadline_s is None else
                    sorted(finish.values())[2])
    first = ROUND_POLICIES[name](setup).close_round(dict(finish), 0.0)
    assert first == ROUND_POLICIES[name](setup).close_round(dict(finish), 0.0)
    assert first.kept and set(first.kept) <= set(finish)
    empty = ROUND_POLICIES[name](setup).close_round({}, 0.0)
    assert empty.kept == [] and empty.seconds == 0.0 and empty.wasted_seconds == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_a_fresh_report_weighs_fully_and_a_stale_one_no_more(name):
    policy = ROUND_POLICIES[name](CASES[name].setup)
    weights = [policy.report_weight(s) for s in range(6)]
    assert weights[0] == 1.0 and all(0 < b <= a for a, b in zip(weights, weights[1:]))
    assert weights[3] == CASES[name].weight_3
    assert policy.buffered or weights == [1.0] * 6  # a synchronous round has no stale reports to discount


@pytest.mark.parametrize("name", NAMES)
def test_the_clock_hook_runs_the_configs_policy_and_answers_its_sample_size(name, tmp_path):
    from fedhf.runtime.sharded import NotSharded
    from fedhf.state.run import RunState
    from fedhf.trainer.hooks.clock import VirtualClock

    settings = {"wait_all": {}, "deadline": {"round_deadline_s": 3.0, "over_selection": 0.5}, "fedbuff": {}}
    args = FederatedConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_clients=6,
                           clients_per_round=2, clock_profile="uniform", round_policy=name, **settings.get(name, {}))
    trainer = SimpleNamespace(args=args, train_dataset=None, client_partitions=[[0]] * 6,
                              plan=SimpleNamespace(params={"w": torch.zeros(2)}), model_device=torch.device("cpu"),
                              shards=NotSharded())
    clock, run = VirtualClock(trainer), RunState({}, {}, {}, {}, rounds_done=0)
    assert type(clock.policy) is ROUND_POLICIES[name] and clock.buffered == clock.policy.buffered
    assert clock.sample_size(trainer, run, 2) == clock.policy.sample_size(2) >= 2
    # a round hook before the clock asked for 4: the policy's sample for 4 reports (the deadline over-selects it)
    assert clock.sample_size(trainer, run, 4) == clock.policy.sample_size(4) == (6 if name == "deadline" else 4)
    off = FederatedConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_clients=6,
                          clients_per_round=2)
    assert VirtualClock(SimpleNamespace(args=off)).sample_size(trainer, run, 99) == 99  # no clock: the loop's


def test_fedbuff_takes_next_arrivals_ties_to_the_earlier_dispatched_and_waits_for_none_already_in():
    """FedBuff's update is the first ``buffer`` reports in arrival order, as next_arrivals picks them: equal report
    times go to the earlier dispatched; reports that arrived before the update cost no time (the hand cases above
    have neither ties nor early reports)."""
    from fedhf.simulation import InFlight, next_arrivals

    policy = ROUND_POLICIES["fedbuff"](RoundSetup(2, 6, report_cap=2))
    finish = {4: 9.0, 1: 7.0, 5: 7.0, 0: 7.0, 2: 3.0}  # dispatch order; three tie at 7 s
    timing = policy.close_round(dict(finish), 5.0)
    assert timing.kept == [2, 1] and timing.seconds == 2.0  # 2 (3 s, already in), then 1: dispatched before 5 and 0
    in_flight = [InFlight(c, 0, t) for c, t in finish.items()]
    for buffer in range(len(finish) + 1):
        picked = ROUND_POLICIES["fedbuff"](RoundSetup(buffer, 6, report_cap=buffer)).close_round(dict(finish), 5.0)
        assert picked.kept == [f.client for f in next_arrivals(in_flight, buffer)]
    early = policy.close_round({3: 1.0, 2: 2.0, 0: 8.0}, 4.0)  # both reports in before the update at 4 s
    assert early.kept == [3, 2] and early.seconds == 0.0
