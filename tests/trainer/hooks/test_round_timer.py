"""Each round's wall time in the history, and the one warning for an oversubscribed CPU that slows the rounds."""

from __future__ import annotations

from fedhf.trainer.hooks.round_timer import RoundTimer, contention_message


def test_the_warning_needs_an_oversubscribed_cpu_several_threads_and_a_slower_round():
    slowed = [2.0, 2.1, 6.0]
    message = contention_message(slowed, load=3.5, cores=2, threads=2)
    assert message.startswith("round 3 took 6.0 s, 3.0x the fastest") and "OMP_NUM_THREADS=1" in message
    assert contention_message(slowed, load=1.9, cores=2, threads=2) is None  # the cores are not oversubscribed
    assert contention_message(slowed, load=3.5, cores=2, threads=1) is None  # one thread: nothing to change
    assert contention_message([2.0, 2.1, 2.9], load=3.5, cores=2, threads=2) is None  # under 1.5x the fastest
    assert contention_message([6.0], load=3.5, cores=2, threads=2) is None  # nothing to compare with yet


def test_the_timer_records_each_round_and_warns_once(monkeypatch):
    import fedhf.trainer.hooks.round_timer as round_timer

    warnings, clock = [], iter([0.0, 1.0, 10.0, 11.0, 20.0, 25.0, 30.0, 35.0])
    monkeypatch.setattr(round_timer.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(round_timer.os, "getloadavg", lambda: (4.0, 4.0, 4.0))
    monkeypatch.setattr(round_timer, "_cores", lambda: 2)
    monkeypatch.setattr(round_timer.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(round_timer.logger, "warning", warnings.append)
    timer, entries = RoundTimer(), []
    for _ in range(4):
        timer.before_round(None, None)
        entries.append({})
        timer.after_aggregate(None, None, None, entries[-1])
    assert [e["round_runtime"] for e in entries] == [1.0, 1.0, 5.0, 5.0]
    assert len(warnings) == 1 and warnings[0].startswith("round 3 took 5.0 s")
