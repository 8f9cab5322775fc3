"""Algorithm comparison on real data: accuracy (and eval loss) against rounds and against communicated MB.

Eleven named algorithms (first-order baselines, local second-order optimizers and their federated corrections) on
three real tasks (benchmarks/comparison_tasks.py: MiniLM-LoRA tweets, a convnet on digits, SFT of a small Llama
on the tweets as instructions) under strong label skew (Dirichlet alpha 0.1) and partial participation, twice:

* at fedhf's defaults -- the papers' hyper-parameters, learning rate included, with no tuning;
* ``--tune``: each algorithm at its own learning rate, chosen from the grid default x ``LR_FACTORS`` by the final
  validation score of one seed (seed 0) on rows held out of the training split (never the test rows), then run
  with every seed and scored on the test rows. The papers tune the learning rate per algorithm; so does this.
  A choice at the grid's edge extends the grid one step further on that side (the 1-3-10 ladder), up to
  ``GRID_EXTENSIONS`` times, so the chosen lr is bracketed by two worse ones; one still at the edge is marked so.
  The chosen lr is printed beside each row, with every grid point's validation score.

Every (task, algorithm, seed) run is stored as its own JSON under ``--runs_dir``, and a run whose JSON
exists with the same settings is skipped, so an interrupted benchmark resumes where it stopped and new
algorithms or seeds are added incrementally. The seed changes the client split, the client sampling, the
model's initialisation and every client's data order; the training and evaluation rows stay the same.
A variant with other hyper-parameters is named ``algorithm@key=value`` (``fedavg@learning_rate=1.0``).
Run with one torch thread, one run at a time: on the shared 2-core machine two threads were 2-5x slower per step
whenever others were busy.

Outputs (``--budget full``): ``algorithms_result.json`` (every run's per-round history), ``algorithms_result.md``
(the tables, also printed) and ``algorithms_<task>[_tuned].png`` beside this script; other budgets write them to
``outputs/benchmarks/algorithms_<budget>/``. About 6-30 s a digits run, 150-300 s a tweets run (fp32, 20 rounds) and
3.5-9 min an llm run (60 rounds) on the shared 2-core AVX2 CPU, two runs at a time.

    python benchmarks/algorithms.py [--budget quick|full] [--datasets tweets,digits,llm] [--algorithms fedavg,...]
                                    [--seeds 0,1,2] [--tune] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from fedhf.metrics import write_json_atomic  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from algorithm_runs import Runner, cached, parse_variant, run_path, run_settings  # noqa: E402
from comparison_report import plot, summarize, table  # noqa: E402
from comparison_tasks import BUDGETS, HERE, TARGETS, TASKS  # noqa: E402
from lr_tuning import stored_tuning, tune, tuning_path, tuning_settings  # noqa: E402

ALGORITHMS = ["fedavg", "local_adamw", "local_muon", "fedmuon", "fedpac_muon", "fedpac_soap", "local_sophia",
              "fedpac_sophia", "scaffold", "fadam_gt", "fedpm"]
# SOAP's preconditioner of the llm's 30,522 x 64 embedding would be a 30,522^2 factor: not run there.
SKIP = {"llm": {"fedpac_soap"}}
# On the llm task Muon orthogonalises the hidden matrices only, as Keller Jordan's Muon and LLM practice do (the
# tied embedding and head on AdamW): the papers' ndim>=2 routing sends the 30,522 x 64 embedding, 96 % of the
# model, through bfloat16 Newton-Schulz (19 min a run on this AVX2 CPU, one validation run, eval loss 5.98).
TASK_VARIANTS = {"llm": {name: name + '@local_optimizer_kwargs={"routing":"hidden_only"}'
                         for name in ("local_muon", "fedmuon", "fedpac_muon")}}

def restore(results_json: str, runs_dir: str, budget: str) -> int:
    """Write a published ``algorithms_result.json``'s test runs and tuning summaries into ``runs_dir``, so a fresh
    checkout adds to the published tables instead of rerunning them (the runs' own JSONs live under outputs/, which
    is not committed). Only runs whose settings are the current code's are written; returns how many."""
    with open(results_json) as f:
        published = json.load(f)
    written = 0
    for record in published["runs"]:
        settings = record["settings"]
        current = run_settings(settings["dataset"], settings["algorithm"], settings["seed"], budget)
        if settings == current and cached(run_path(runs_dir, settings), settings) is None:
            write_json_atomic(record, run_path(runs_dir, settings))
            written += 1
    for dataset, summaries in published["tuning"].items():
        for name, summary in summaries.items():
            path = tuning_path(runs_dir, dataset, name)
            if not os.path.exists(path):  # the summaries were made at the budget of the runs beside them
                write_json_atomic({**summary, "settings": tuning_settings(dataset, budget)}, path)
                written += 1
    return written


def stored_records(runs_dir: str, budget: str) -> list:
    """Every stored test run of this budget whose settings are still the current ones (any task, algorithm or
    variant, seed), default algorithms first: the report covers all of them, not just this invocation's."""
    records = []
    for dataset in TASKS:
        folder = os.path.join(runs_dir, dataset)
        found = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        for label in [a for a in ALGORITHMS if a in found] + [a for a in found if a not in ALGORITHMS]:
            files = os.listdir(os.path.join(folder, label))
            seeds = sorted(int(f[4:-5]) for f in files if f.startswith("seed") and f.endswith(".json"))
            for seed in seeds:
                settings = run_settings(dataset, label, seed, budget)
                record = cached(run_path(runs_dir, settings), settings)
                if record is not None:
                    records.append(record)
    return records


def report(records: list, tuning: dict, budget: str, out_dir: str, threads: int) -> str:
    os.makedirs(out_dir, exist_ok=True)
    loads = [x for r in records for x in r.get("load_average_1min", [])]
    commits = sorted({r.get("fedhf_commit", "?") for r in records})
    text = [f"Budget `{budget}`, fedhf {', '.join(commits)}, torch {torch.__version__}, transformers "
            f"{transformers.__version__}, {threads} torch thread(s) per run, one run at a time; "
            f"{sum(r['wall_s'] for r in records) / 60:.1f} min of training and evaluation in all (tuning runs not "
            "counted)" + (f"; 1-min load average during the runs {min(loads):.1f}-{max(loads):.1f} (2 cores, shared)"
                          if loads else "") + ".", ""]
    summaries_all = {}
    for dataset in TASKS:
        runs = [r for r in records if r["settings"]["dataset"] == dataset]
        if not runs:
            continue
        by_label = {}
        for r in runs:
            by_label.setdefault(r["settings"]["algorithm"], []).append(r)
        tuned = tuning.get(dataset, {})
        chosen = {name: tuned[name] for name in [a for a in ALGORITHMS if a in tuned] + sorted(set(tuned) - set(ALGORITHMS))
                  if tuned[name]["chosen"] in by_label}
        sections = {"defaults": {label: rs for label, rs in by_label.items() if label in ALGORITHMS},
                    "tuned": {name: by_label[t["chosen"]] for name, t in chosen.items()}}
        for section, by_algorithm in sections.items():
            if not by_algorithm:
                continue
            summaries = {label: summarize(rs, TARGETS[dataset]) for label, rs in by_algorithm.items()}
            summaries_all.setdefault(dataset, {})[section] = summaries
            heading = ("each at its default hyper-parameters"
                       if section == "defaults" else "each at the learning rate its validation grid chose")
            text += [f"### {dataset}, {heading}", "",
                     table(dataset, summaries, runs, chosen if section == "tuned" else None)]
            suffix = "" if section == "defaults" else "_tuned"
            plot(dataset, by_algorithm, runs[0]["majority_accuracy"],
                 os.path.join(out_dir, f"algorithms_{dataset}{suffix}.png"), f"{dataset} ({section})")
    path = os.path.join(out_dir, "algorithms_result.json")
    write_json_atomic({"budget": budget, "targets": TARGETS, "summaries": summaries_all, "tuning": tuning,
                       "runs": records}, path)
    os.chmod(path, 0o644)  # written through mkstemp, which makes it owner-only
    markdown = "\n".join(text)
    with open(os.path.join(out_dir, "algorithms_result.md"), "w") as f:
        f.write(markdown)
    return markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="full")
    parser.add_argument("--datasets", default="tweets,digits", help=f"Some of {TASKS}.")
    parser.add_argument("--algorithms", default=None,
                        help="Names, or variants name@key=value; default: the eleven.")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tune", action="store_true",
                        help="Choose each algorithm's lr on validation rows (seed 0), then run the seeds at it.")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared 2-core machine one thread was faster than two).")
    parser.add_argument("--runs_dir", default=None, help="Per-run JSONs; default outputs/benchmarks/algorithms/BUDGET.")
    parser.add_argument("--results_dir", default=None,
                        help="Where the JSON, table and plots go; default benchmarks/ for full, else outputs/.")
    parser.add_argument("--restore", default=None, metavar="RESULTS_JSON",
                        help="First copy a published algorithms_result.json's runs and tunings into --runs_dir.")
    cli = parser.parse_args()
    torch.set_num_threads(cli.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    seeds = [int(s) for s in cli.seeds.split(",") if s]
    runs_dir = cli.runs_dir or os.path.join("outputs", "benchmarks", "algorithms", cli.budget)
    results_dir = cli.results_dir or (HERE if cli.budget == "full" else
                                      os.path.join("outputs", "benchmarks", f"algorithms_{cli.budget}"))
    chosen = [d for d in cli.datasets.split(",") if d]
    if set(chosen) - set(TASKS):
        parser.error(f"--datasets: unknown {sorted(set(chosen) - set(TASKS))}; known: {TASKS} ('' reports only)")
    if cli.restore:
        print(f"restored {restore(cli.restore, runs_dir, cli.budget)} runs and tunings into {runs_dir}")
    run = Runner(runs_dir)
    for dataset in chosen:
        labels = ALGORITHMS if cli.algorithms is None else cli.algorithms.split(",")
        labels = [TASK_VARIANTS.get(dataset, {}).get(label, label) for label in labels
                  if label and parse_variant(label)[0] not in SKIP.get(dataset, ())]
        for label in labels:  # one algorithm at a time (tuned, then its seeds): a cut-short run leaves whole rows
            label = tune(dataset, label, cli.budget, runs_dir, run)["chosen"] if cli.tune else label
            for seed in seeds:
                run(run_settings(dataset, label, seed, cli.budget))
    print(report(stored_records(runs_dir, cli.budget), stored_tuning(runs_dir), cli.budget, results_dir,
                 cli.threads))
    run.exit_on_failures()


if __name__ == "__main__":
    main()
