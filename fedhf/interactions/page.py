"""docs/interactions.md, generated from the declarations (fedhf/interactions/features.py) and the refusal table:

    python -m fedhf.interactions.page > docs/interactions.md

tests/interactions/test_page.py keeps the page equal to what this prints."""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Callable, Dict, List

from .features import FINDINGS, MUST_REFUSE, features
from .matrix import EQUAL, REFUSED, STATISTICAL, TRAINS, alone, find_pair, lookup, pairs
from .oracles import AGREEMENT_LIMIT, DROP_RATE

HEADER = """# Feature interactions (generated)

[Index](README.md). Generated from the declarations in fedhf/interactions/features.py and the refusal table
(fedhf/trainer/config/combinations/); do not edit by hand (tests/interactions/test_page.py keeps it equal).
Regenerate with `python -m fedhf.interactions.page > docs/interactions.md` (looks every pair up), or with
`python benchmarks/interaction_matrix.py --page docs/interactions.md`, which runs every pair below
([result](../benchmarks/interaction_matrix_result.txt)) and takes the refusals from the run.

Every feature is one settings change of a tiny reference run (fedhf/interactions/reference.py: a 1-layer Llama with
LoRA r=4, synthetic rows of 4-16 tokens padded per batch, 4 clients, 3 per round, 2 rounds of 2 local steps).
Features of one axis (one setting) are alternatives, not pairs; an algorithm is a preset of the server rule,
correction, local optimizer and state sync, whose entries are paired, so algorithms are checked alone. Every other
pair is either refused (before any work, by fedhf, with the fix named) or carries one invariant:

* **equal**: the pair's run equals its neutral twin's (the partner alone, or for `hook:zero_change` the initial
  model) to `atol + rtol |twin|` per entry of every trainable tensor and of the history keys both runs log
  (train_loss, participants, eval_loss, update norms, bytes, simulated times). The tolerances, with where the
  docs state them, are in the first table; the matrix asserts exactly these.
* **statistical**: `dropout_masks`: LoRA dropout 0.5 drops {lo:.0%}-{hi:.0%} of the entries it sees; no two consecutive
  forwards of one shape, and no two processes' row shards, agree on more than {agree:.0%} of them (independent
  masks agree on about half). `fedbuff_times`: on identical devices and rows of one length every client's round
  takes the same time T, so FedBuff's every server update happens at a whole multiple of T.
* **trains**: finite loss (withheld, NaN, under DP or secure aggregation), the model moves, nothing crashes; only
  where no twin or property applies.
"""


def tolerance_table() -> List[str]:
    out = ["## Neutral twins and their tolerances", "", "| feature | twin | rtol | atol | claim |",
           "|---|---|---|---|---|"]
    for f in features():
        if f.twin is None:
            continue
        twin = "initial model" if f.twin.initial else "without it" + (" (1 process)" if f.processes > 1 else "")
        out.append(f"| `{f.name}` | {twin} | {f.twin.rtol:g} | {f.twin.atol:g} | {f.twin.source} |")
        for partner, t in f.twin.partners.items():
            text = "no twin (another random stream)" if t is None else f"rtol {t[0]:g}, atol {t[1]:g}: {t[2]}"
            out.append(f"| `{f.name}` with `{partner}` | | | | {text} |")
    return out + [""]


def feature_table() -> List[str]:
    out = ["## Features", "", "| feature | axis | settings | checked |", "|---|---|---|---|"]
    for f in features():
        what = dict(f.settings)
        what.update({"round_hooks": list(f.hooks)} if f.hooks else {})
        what.update({"data": dict(f.data)} if f.data else {})
        what.update({"model": dict(f.model)} if f.model else {})
        what.update({"resume": True} if f.resume else {})
        checked = ("alone: must be refused" if f.name in MUST_REFUSE else "alone" if f.alone else
                   "twin" if f.twin else f.statistical or "pairs")
        proc = ", 2 processes" if f.processes > 1 else ""
        out.append(f"| `{f.name}` | {f.axis}{proc} | `{what}` | {checked} |")
    return out + [""]


def refused_by_table(p) -> bool:
    return lookup(p.spec()) is not None


def pair_table(refused: Callable = refused_by_table) -> List[str]:
    rows: Dict[str, Dict[str, List[str]]] = defaultdict(lambda: defaultdict(list))
    counts: Dict[str, int] = defaultdict(int)
    for p in pairs():
        oracle, f, _ = p.choice()
        verdict = REFUSED if refused(p) else oracle
        counts[verdict] += 1
        rows[p.a.name][verdict].append(f"`{p.b.name}`")
    out = ["## Pairs", "",
           f"{sum(counts.values())} pairs: {counts[REFUSED]} refused, {counts[EQUAL]} equal within a tolerance, "
           f"{counts[STATISTICAL]} statistical, {counts[TRAINS]} trains. Each pair is listed once, in the row of "
           "its first feature.", "",
           "| feature | refused with | equal (twin of either) with | statistical with | trains with |",
           "|---|---|---|---|---|"]
    for name, by in rows.items():
        out.append(f"| `{name}` | " + " | ".join(", ".join(by[v]) or "-" for v in (REFUSED, EQUAL, STATISTICAL,
                                                                                  TRAINS)) + " |")
    return out + [""]


def findings_table() -> List[str]:
    out = ["## The review's findings and the oracle that catches each", "",
           "| # | finding | caught by | oracle |", "|---|---|---|---|"]
    for number, (what, cases) in FINDINGS.items():
        shown = ", ".join(" x ".join(f"`{n}`" for n in case) + ("" if len(case) == 2 else " alone") for case in cases)
        oracles = {_oracle(case) for case in cases}
        out.append(f"| {number} | {what} | {shown} | {', '.join(sorted(oracles))} |")
    return out + [""]


def _oracle(case) -> str:
    if len(case) == 1:
        return "refused (declared)"
    oracle, f, t = find_pair(*case).choice()
    return f"{oracle} ({f.name}" + (f", atol {t[1]:g})" if t else ")") if f else oracle


def page(refused: Callable = refused_by_table) -> str:
    body = [HEADER.format(lo=DROP_RATE[0], hi=DROP_RATE[1], agree=AGREEMENT_LIMIT), *findings_table(),
            *tolerance_table(), *feature_table(), *pair_table(refused), "## Checked alone", "",
            ", ".join(f"`{f.name}`" + (" (must be refused)" if f.name in MUST_REFUSE else "") for f in alone()), ""]
    return "\n".join(body)


def refused_in(text: str) -> set:
    """The refused pairs a page lists (its pair table's second column), as pair names."""
    out, inside = set(), False
    for line in text.splitlines():
        inside = line == "## Pairs" or (inside and not line.startswith("## "))
        cells = [c.strip() for c in line.split(" | ")]
        if inside and line.startswith("| `") and cells[1] != "-":
            row = cells[0].strip("|` ")
            out |= {f"{row} x {partner.strip('` ')}" for partner in cells[1].split(", ")}
    return out


if __name__ == "__main__":
    sys.stdout.write(page())
