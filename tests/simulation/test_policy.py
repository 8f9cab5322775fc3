"""Round policies and device profiles on simulated time (fedhf/simulation/), against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedhf.simulation import (ClientProfile, available_clients, client_seconds, csv_profiles, deadline_round,
                              lognormal_profiles, wait_for_all)
from fedhf.simulation.profile import MBPS


def test_a_clients_round_is_download_then_compute_then_upload():
    device = ClientProfile(tokens_per_s=100.0, uplink_bytes_per_s=10.0, downlink_bytes_per_s=40.0)
    assert client_seconds(device, tokens=500, uplink_bytes=30, downlink_bytes=80) == 80 / 40 + 500 / 100 + 30 / 10


def test_wait_for_all_keeps_everyone_and_lasts_as_long_as_the_slowest():
    timing = wait_for_all({3: 2.0, 1: 7.5, 4: 1.0})
    assert timing.kept == [3, 1, 4] and timing.seconds == 7.5 and timing.wasted_seconds == 0.0
    assert wait_for_all({}).seconds == 0.0


def test_the_deadline_keeps_the_first_target_reports_and_counts_the_dropped_work():
    finish = {0: 5.0, 1: 1.0, 2: 9.0, 3: 3.0, 4: 12.0}  # sampled in this order
    reached = deadline_round(finish, deadline_s=10.0, target=2)
    assert reached.kept == [1, 3] and reached.seconds == 3.0  # ends at the 2nd report
    assert reached.wasted_seconds == 3.0 * 3  # clients 0, 2, 4 were cut off at 3 s
    short = deadline_round(finish, deadline_s=6.0, target=4)
    assert short.kept == [0, 1, 3] and short.seconds == 6.0  # the deadline ends it
    assert short.wasted_seconds == 6.0 + 6.0  # clients 2 and 4 worked until the deadline
    early = deadline_round({0: 1.0, 1: 2.0}, deadline_s=6.0, target=4)
    assert early.kept == [0, 1] and early.seconds == 2.0  # everyone reported before the deadline


def test_ties_go_to_the_earlier_sampled_client():
    assert deadline_round({7: 2.0, 2: 2.0, 5: 2.0}, deadline_s=3.0, target=2).kept == [7, 2]


def test_lognormal_profiles_have_the_medians_and_the_spread():
    profiles = lognormal_profiles(4000, seed=0, tokens_per_s=1000.0, uplink_mbps=5.0, downlink_mbps=20.0, sigma=1.0)
    speeds = np.log([p.tokens_per_s / 1000.0 for p in profiles])
    links = np.log([p.uplink_bytes_per_s / (5.0 * MBPS) for p in profiles])
    assert abs(np.median(speeds)) < 0.06 and abs(speeds.std() - 1.0) < 0.05
    assert abs(links.std() - 1.0) < 0.05 and abs(np.corrcoef(speeds, links)[0, 1]) < 0.05  # independent factors
    assert all(math.isclose(p.downlink_bytes_per_s / p.uplink_bytes_per_s, 4.0) for p in profiles[:10])
    uniform = lognormal_profiles(3, seed=0, tokens_per_s=1000.0, uplink_mbps=5.0, downlink_mbps=20.0, sigma=0.0)
    assert {p.tokens_per_s for p in uniform} == {1000.0}
    assert lognormal_profiles(5, 1, 1.0, 1.0, 1.0, 1.0) == lognormal_profiles(5, 1, 1.0, 1.0, 1.0, 1.0)


def test_availability_is_drawn_per_round_and_client_whoever_else_was_sampled():
    profiles = [ClientProfile(1.0, 1.0, 1.0, availability=0.5)] * 400
    online = available_clients(0, 3, range(400), profiles)
    assert 160 < len(online) < 240
    assert available_clients(0, 3, [5, 9, 11], profiles) == [c for c in [5, 9, 11] if c in online]
    assert available_clients(0, 4, range(400), profiles) != online
    assert available_clients(0, 3, range(10), [ClientProfile(1.0, 1.0, 1.0)] * 10) == list(range(10))


def test_a_csv_trace_gives_each_client_its_row_and_refuses_gaps(tmp_path):
    trace = tmp_path / "devices.csv"
    trace.write_text("client_id,tokens_per_s,uplink_mbps,downlink_mbps,availability\n1,50,2,8,0.5\n0,100,1,4,\n")
    profiles = csv_profiles(str(trace), 2)
    assert profiles[0] == ClientProfile(100.0, 1 * MBPS, 4 * MBPS, 1.0)
    assert profiles[1] == ClientProfile(50.0, 2 * MBPS, 8 * MBPS, 0.5)
    with pytest.raises(ValueError, match=r"no row for client\(s\) \[2\]"):
        csv_profiles(str(trace), 3)
    trace.write_text("client_id,tokens_per_s,uplink_mbps\n0,1,1\n")
    with pytest.raises(ValueError, match="lacks the column"):
        csv_profiles(str(trace), 1)
    trace.write_text("client_id,tokens_per_s,uplink_mbps,downlink_mbps\n0,-1,1,1\n")
    with pytest.raises(ValueError, match="line 2: speeds must be positive"):
        csv_profiles(str(trace), 1)


def test_staleness_weights_arrivals_and_refills_as_fedbuff_says():
    from fedhf.simulation import InFlight, next_arrivals, refill, staleness_weight

    assert staleness_weight(0) == 1.0 and staleness_weight(3) == 0.5
    flights = [InFlight(4, 0, 9.0), InFlight(1, 0, 2.0), InFlight(7, 1, 2.0), InFlight(2, 1, 5.0)]
    assert [f.client for f in next_arrivals(flights, 3)] == [1, 7, 2]  # ties: the earlier dispatched
    assert refill([3, 4, 1, 0, 6], busy=[4, 1], free_slots=2) == [3, 0]
    assert refill([3], busy=[], free_slots=0) == []
