"""The interaction matrix's covering subset (fedhf/interactions/matrix.py: covering_subset): every paired feature at
least once, the pairs that catch the correctness review's findings (docs/interactions.md) and the declared refusals,
each refused by fedhf before any work with the fix named or holding its invariant. benchmarks/interaction_matrix.py
runs every pair."""

from __future__ import annotations

import logging

import torch

from fedhf import metrics
from fedhf.interactions.matrix import covering_subset
from fedhf.interactions.suite import run_pairs
from fedhf.trainer.hooks import outputs


def test_covering_subset_is_refused_or_holds_its_invariant():
    level, threads = logging.getLogger("fedhf").level, torch.get_num_threads()
    chosen, lone = covering_subset()
    report = run_pairs(chosen, lone, log=lambda _: None)
    assert report.launches >= 1 and len(report.verdicts) == len(chosen)
    assert [f"{v.name}: {v.problem}" for v in report.failing] == []
    # the 1-process runs train in this process: what they quiet is given back (a kept no-op plot once left later
    # tests without their history plot)
    assert outputs.plot_history is metrics.plot_history
    assert (logging.getLogger("fedhf").level, torch.get_num_threads()) == (level, threads)
