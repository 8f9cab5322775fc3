"""Algorithms at the same simulated time under heavy-tailed devices (fedhf/trainer/hooks/clock.py, docs/clock.md).

The tweets classifier (MiniLM-L6 + LoRA r8, benchmarks/comparison_tasks.py; 20 clients, Dirichlet 0.5, 5 local
steps of 16 rows) on log-normal devices (clock_spread 1: the 5 % slowest at least 5x below the median; median 1,000
tokens/s, 5 Mbit/s up, 20 down), every run stopped at the same simulated budget:

* synchronous FedAvg: 5 clients a round, each round waits for its slowest;
* deadline FedAvg: 30 % over-selection, the first 5 reports within the deadline kept;
* FedBuff FedAvg: 10 clients always training, an update after every 5 reports, stale changes weighted 1/sqrt(1+s);
* FedBuff FAdam-GT: the same with FAdam-GT's clients and tracking correction.

    python benchmarks/clock.py [--seeds 0 1 2] [--budget-s 60] [--report-only]

Every run is stored (benchmarks/algorithm_runs.py) and reused while its settings match. Writes
benchmarks/clock_result.md/.json and clock_accuracy_vs_time.png; the last line is

    clock_accuracy_at_<T>s sync=<acc> deadline=<acc> fedbuff=<acc> fedbuff_fadam_gt=<acc>

(mean over seeds of the last evaluation at or before T, the simulated time every run reached: the cap of 40 server
updates can end a policy with fast rounds before the budget).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from algorithm_runs import Runner, run_settings  # noqa: E402
from comparison_tasks import HERE  # noqa: E402

DEVICES = "@clock_profile=lognormal@clock_spread=1.0@clock_tokens_per_s=1000"
# the lrs the algorithm comparison's validation grid chose on this task (algorithms_result.md)
VARIANTS = {
    "sync": "fedavg@learning_rate=0.3" + DEVICES,
    "deadline": "fedavg@learning_rate=0.3" + DEVICES + "@round_policy=deadline@round_deadline_s=4.0@over_selection=0.3",
    "fedbuff": "fedavg@learning_rate=0.3" + DEVICES + "@round_policy=fedbuff@async_concurrency=10",
    "fedbuff_fadam_gt": "fadam_gt@learning_rate=0.003" + DEVICES + "@round_policy=fedbuff@async_concurrency=10",
}
MAX_ROUNDS = 40  # a cap on server updates; the simulated budget stops every run before it here
BUDGET = dict(train_rows=1000, eval_rows=200, num_clients=20, clients_per_round=5, local_steps=5, batch_size=16,
              dirichlet_alpha=0.5, num_rounds=MAX_ROUNDS, eval_every_rounds=2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget-s", type=float, default=60.0, help="simulated seconds per run")
    parser.add_argument("--out", default=os.path.join(HERE, "clock_runs"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    runner, records = Runner(args.out), {}
    for name, label in VARIANTS.items():
        for seed in args.seeds:
            settings = run_settings("tweets", f"{label}@clock_budget_s={args.budget_s}", seed, "clock",
                                    budgets={"clock": {"tweets": BUDGET}})
            record = None
            if args.report_only:
                from algorithm_runs import cached, run_path
                record = cached(run_path(args.out, settings), settings)
            else:
                record = runner(settings)
            if record is not None:
                records.setdefault(name, []).append(record)
    print(report(records, args))


def last_eval(record: dict, until: float = float("inf"), metric: str = "eval_accuracy") -> dict:
    """The last evaluation at or before ``until`` simulated seconds."""
    evaluated = [h for h in record["history"] if metric in h and h.get("sim_time_s", 0.0) <= until]
    return evaluated[-1]


def report(records: dict, args, variants: dict = VARIANTS, metric: str = "eval_accuracy", stem: str = "clock",
           title: str = "Round policies on log-normal devices (one line per seed)",
           ylabel: str = "eval accuracy (200 held-out tweets)", notes: str = "") -> str:
    """The table (``<stem>_result.md``/``.json``), the plot (``<stem>_accuracy_vs_time.png``) and the summary line
    of ``records`` ({variant: [record per seed]}), scored by ``metric``; ``notes`` follow the table."""
    last = lambda record, until=float("inf"): last_eval(record, until, metric)  # noqa: E731
    rows, summary = [], {}
    # MAX_ROUNDS can end a policy with fast rounds before the budget: compare all at the time every run reached
    common = min((last(r)["sim_time_s"] for runs in records.values() for r in runs), default=0.0)
    for name in variants:
        runs = records.get(name, [])
        if not runs:
            rows.append(f"| {name} | pending | pending | | | |")
            continue
        final = [last(r) for r in runs]
        acc = [f[metric] for f in final]
        at_common = [last(r, common)[metric] for r in runs]
        summary[name] = {"accuracy": acc, "accuracy_at_common_time": at_common, "rounds": [f["round"] for f in final],
                         "sim_time_s": [f.get("sim_time_s", float("nan")) for f in final],
                         "communicated_MB": [f["communicated_MB"] for f in final],
                         "seeds": [r["settings"]["seed"] for r in runs]}
        rows.append(f"| {name} | {np.mean(at_common):.3f} ({', '.join(f'{a:.3f}' for a in at_common)}) | "
                    f"{np.mean(acc):.3f} ± {np.std(acc):.3f} ({', '.join(f'{a:.3f}' for a in acc)}) | "
                    f"{np.mean(summary[name]['rounds']):.1f} | {np.mean(summary[name]['sim_time_s']):.1f} | "
                    f"{np.mean(summary[name]['communicated_MB']):.1f} |")
    with open(os.path.join(HERE, f"{stem}_result.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(records, os.path.join(HERE, f"{stem}_accuracy_vs_time.png"), variants, metric, title, ylabel)
    table = "\n".join([f"| policy | accuracy at {common:.1f} simulated s (the time every run reached; per seed) | "
                        "accuracy at the run's end (mean ± std, per seed) | server updates | simulated s at the end | "
                        "MB |", "|---|---|---|---|---|---|", *rows])
    with open(os.path.join(HERE, f"{stem}_result.md"), "w") as f:
        f.write(f"# Simulated time: accuracy at a {args.budget_s:.0f} s budget (benchmarks/{stem}.py)\n\n{table}\n"
                + (f"\n{notes}\n" if notes else ""))
    line = f"{stem}_accuracy_at_{common:.0f}s " + " ".join(
        f"{n}={np.mean(summary[n]['accuracy_at_common_time']):.3f}" if n in summary else f"{n}=pending"
        for n in variants)
    return table + "\n" + line


def plot(records: dict, path: str, variants: dict = VARIANTS, metric: str = "eval_accuracy",
         title: str = "", ylabel: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, runs in records.items():
        curves = [[(h.get("sim_time_s", 0.0), h[metric]) for h in r["history"] if metric in h]
                  for r in runs]
        for i, curve in enumerate(curves):
            xs, ys = zip(*curve)
            ax.plot(xs, ys, "o-" if i == 0 else "o--", color=f"C{list(variants).index(name)}", alpha=0.8,
                    label=name if i == 0 else None, markersize=3)
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
