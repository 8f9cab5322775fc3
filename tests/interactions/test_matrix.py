"""The interaction matrix's covering subset (fedhf/interactions/matrix.py: covering_subset): every paired feature at
least once, the pairs that catch the correctness review's findings (docs/interactions.md) and the declared refusals,
each refused by fedhf before any work with the fix named or holding its invariant. benchmarks/interaction_matrix.py
runs every pair."""

from __future__ import annotations

from fedhf.interactions.matrix import covering_subset
from fedhf.interactions.suite import run_pairs


def test_covering_subset_is_refused_or_holds_its_invariant():
    chosen, lone = covering_subset()
    report = run_pairs(chosen, lone, log=lambda _: None)
    assert report.launches >= 1 and len(report.verdicts) == len(chosen)
    assert [f"{v.name}: {v.problem}" for v in report.failing] == []
