"""Each round's wall time in the history (``round_runtime``: the clients' training and the aggregation, evaluation
excluded), and one warning when the CPU is oversubscribed and a round has slowed down.

On a 2-core CPU that another process keeps busy, torch's default of one thread per core made a MiniLM-LoRA round
several times slower than one thread (docs/scaling.md, "Threads on a shared CPU"): the threads wait on each other.
Nothing else tells a user why a run crawls, so the round that first shows it names the fix.
"""

from __future__ import annotations

import os
import time
from typing import List, Optional

import torch
from transformers.utils import logging

from .base import RoundHook

logger = logging.get_logger(__name__)

SLOWDOWN = 1.5  # a round this many times slower than the fastest so far counts as a jump


def contention_message(seconds: List[float], load: float, cores: int, threads: int) -> Optional[str]:
    """The warning for the last of ``seconds`` (one per round so far), or None: the 1-minute load average exceeds
    the cores, torch runs more than one thread, and the round took SLOWDOWN x the fastest earlier round."""
    # an empty round (no client sampled) can take 0.000 s: no ratio to it
    if len(seconds) < 2 or threads <= 1 or load <= cores or seconds[-1] < SLOWDOWN * min(seconds[:-1]) \
            or min(seconds[:-1]) <= 0:
        return None
    return (f"round {len(seconds)} took {seconds[-1]:.1f} s, {seconds[-1] / min(seconds[:-1]):.1f}x the fastest, "
            f"while the load average ({load:.1f}) exceeds the {cores} CPU cores and torch runs {threads} threads: on "
            "a shared CPU set OMP_NUM_THREADS=1 (or torch.set_num_threads(1)) before the run; see docs/scaling.md.")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class RoundTimer(RoundHook):
    """``round_runtime`` in each round's entry; the contention warning at most once per run."""

    def __init__(self) -> None:
        self.started, self.seconds, self.warned = 0.0, [], False

    def before_round(self, trainer, run) -> None:
        self.started = time.perf_counter()

    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        entry["round_runtime"] = round(time.perf_counter() - self.started, 3)
        self.seconds.append(entry["round_runtime"])
        if self.warned or not hasattr(os, "getloadavg"):
            return
        message = contention_message(self.seconds, os.getloadavg()[0], _cores(), torch.get_num_threads())
        if message:
            self.warned = True
            logger.warning(message)
