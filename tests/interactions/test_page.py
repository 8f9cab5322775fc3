"""docs/interactions.md is what fedhf.interactions.page generates from the declarations and the refusal table."""

from __future__ import annotations

import os

from fedhf.interactions.matrix import lookup, pairs
from fedhf.interactions.page import page, refused_in

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                    "interactions.md")
SAMPLE = 9  # every 9th pair's refusal is looked up again (all of them: ~2 s a hundred builds, in the benchmark)


def _text() -> str:
    with open(PAGE) as f:
        return f.read()


def test_page_equals_the_declarations():
    """Everything but the refusal column regenerated exactly (features, twins, tolerances, oracles, findings);
    the refusals as the page lists them. Regenerate: python -m fedhf.interactions.page > docs/interactions.md"""
    text = _text()
    listed = refused_in(text)
    assert page(refused=lambda p: p.name in listed) == text


def test_the_pages_refusals_are_the_tables():
    listed = refused_in(_text())
    wrong = [p.name for p in pairs()[::SAMPLE] if (lookup(p.spec()) is not None) != (p.name in listed)]
    assert wrong == []
