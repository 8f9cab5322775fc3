"""Per-algorithm learning-rate tuning for the algorithm comparison (benchmarks/algorithms.py ``--tune``).

Each algorithm's lr is chosen from a grid of multiples of its default by the final validation score of seed 0 on
rows held out of the training split (never the test rows). A choice at the grid's edge extends the grid one rung
further on that side (the 1-3-10 ladder), up to ``GRID_EXTENSIONS`` times, so the chosen lr is bracketed by two
worse ones; one still at the edge is marked so. A tuning's summary is stored beside the runs with every grid
point's score, and a stored tuning is extended from its own grid instead of being rerun.
"""

from __future__ import annotations

import json
import math
import os

from algorithm_runs import final_score, parse_variant, run_settings
from comparison_tasks import SCORE, TASKS

from fedhf.metrics import write_json_atomic

# The tuning grids, as multiples of each algorithm's default lr: three decades around it, since the defaults come
# from papers on other models (e.g. Sophia's 3e-4 clips 96 % of its coordinates on digits).
LR_FACTORS = {"tweets": (1.0, 3.0, 10.0),  # upward only: at the defaults nothing left the majority class
              "digits": (0.1, 0.3, 1.0, 3.0, 10.0, 30.0),
              # the first 60-round grids (3x-100x, by answer accuracy) chose 3x or 10x, and FAdamGT's and
              # FedPAC_Muon's 1x scored higher still: three rungs from the default, extended at an edge
              "llm": (1.0, 3.0, 10.0)}
GRID_EXTENSIONS = 2  # steps beyond an edge, per tuning: each is one more seed-0 run

def ladder_step(factor: float, direction: int) -> float:
    """The neighbour of ``factor`` on the ladder ..., 0.1, 0.3, 1, 3, 10, 30, ... above (+1) or below (-1); with
    0, the rung ``factor`` is on (an lr read back from a stored grid is 3.0000000000000004 x its default)."""
    rung = round(2 * math.log10(factor)) + direction  # 1 -> 0, 3 -> 1, 10 -> 2, 0.3 -> -1
    return 10.0 ** (rung // 2) * (3.0 if rung % 2 else 1.0)


def default_lr(label: str) -> float:
    """The named algorithm's default (paper) learning rate."""
    from fedhf.algorithms import get_algorithm

    return get_algorithm(parse_variant(label)[0]).local_optimizer.kwargs["lr"]


def grid_labels(label: str, factors) -> dict:
    """{lr: label} of the tuning grid default x ``factors`` around ``label`` (a name or a variant such as
    ``fedpac_muon@routing=hidden_only``); the default lr keeps the label as given, so its runs are the defaults'."""
    default = default_lr(label)
    return {float(f"{default * f:.3g}"): label if f == 1.0 else f"{label}@learning_rate={default * f:.3g}"
            for f in sorted(factors)}


def tuning_path(runs_dir: str, dataset: str, name: str) -> str:
    return os.path.join(runs_dir, "tuning", dataset, f"{name}.json")


def tune(dataset: str, name: str, budget: str, runs_dir: str, run) -> dict:
    """Pick ``name``'s lr on the validation rows (seed 0); ``run(settings)`` trains or loads one run. A choice at
    an edge of the grid adds the next lr beyond it (``GRID_EXTENSIONS`` at most). Stored as {"grid": {lr:
    validation score}, "chosen_lr", "chosen": label, "at_grid_edge"} beside the runs."""
    scores = stored_scores(runs_dir, dataset, name, budget)
    default = default_lr(name)
    # a stored tuning is extended from where it stopped; a new one starts from the task's grid
    factors = {ladder_step(lr / default, 0) for lr in scores} or set(LR_FACTORS[dataset])
    for extension in range(GRID_EXTENSIONS + 1):
        grid = grid_labels(name, factors)
        for lr, label in grid.items():
            if lr not in scores:
                record = run(run_settings(dataset, label, 0, budget, validation=True))
                scores[lr] = None if record is None else final_score(record)
        finished = {lr: v for lr, v in scores.items() if v is not None}
        if not finished:
            raise RuntimeError(f"{dataset} {name}: every tuning run failed")
        chosen = max(finished, key=finished.get)
        at_edge = chosen in (min(grid), max(grid))
        if not at_edge or extension == GRID_EXTENSIONS:
            break
        factors.add(ladder_step(min(factors), -1) if chosen == min(grid) else ladder_step(max(factors), +1))
    summary = {"score": SCORE[dataset], "grid": {str(lr): scores[lr] for lr in sorted(scores)}, "chosen_lr": chosen,
               "chosen": grid[chosen], "at_grid_edge": at_edge, "settings": tuning_settings(dataset, budget)}
    write_json_atomic(summary, tuning_path(runs_dir, dataset, name))
    return summary


def tuning_settings(dataset: str, budget: str) -> dict:
    """What a tuning's validation runs share, whatever the algorithm: stored with its summary, so that scores
    measured at another budget (the llm task went from 20 to 60 rounds) are never taken for this one's."""
    settings = run_settings(dataset, "", 0, budget, validation=True)
    del settings["algorithm"]
    return settings


def stored_scores(runs_dir: str, dataset: str, name: str, budget: str) -> dict:
    """{lr: validation score} of a stored tuning of ``name`` at these settings (empty if none): the grid points it
    already measured are not run again when the grid grows or the runs' own JSONs are gone (``--restore``)."""
    path = tuning_path(runs_dir, dataset, name)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        stored = json.load(f)
    if stored.get("settings") != tuning_settings(dataset, budget):
        return {}
    return {float(lr): score for lr, score in stored["grid"].items()}


def stored_tuning(runs_dir: str) -> dict:
    """{task: {algorithm: tuning summary}} of every stored tuning."""
    tuning = {}
    for dataset in TASKS:
        folder = os.path.join(runs_dir, "tuning", dataset)
        for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            with open(os.path.join(folder, file)) as f:
                tuning.setdefault(dataset, {})[file[:-5]] = json.load(f)
    return tuning
