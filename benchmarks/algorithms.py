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
import math
import os
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from fedhf import FederatedConfig, FederatedTrainer  # noqa: E402
from fedhf.data import partition_dataset  # noqa: E402
from fedhf.metrics import accuracy_metrics, write_json_atomic  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comparison_report import plot, summarize, table  # noqa: E402
from comparison_tasks import (ACCURACY, BUDGETS, HERE, SCORE, TARGETS, TASKS, build_model,  # noqa: E402
                              load_data, with_validation)

ALGORITHMS = ["fedavg", "local_adamw", "local_muon", "fedmuon", "fedpac_muon", "fedpac_soap", "local_sophia",
              "fedpac_sophia", "scaffold", "fadam_gt", "fedpm"]
# SOAP's preconditioner of the llm's 30,522 x 64 embedding would be a 30,522^2 factor: not run there.
SKIP = {"llm": {"fedpac_soap"}}
# On the llm task Muon orthogonalises the hidden matrices only, as Keller Jordan's Muon and LLM practice do (the
# tied embedding and head on AdamW): the papers' ndim>=2 routing sends the 30,522 x 64 embedding, 96 % of the
# model, through bfloat16 Newton-Schulz (19 min a run on this AVX2 CPU, one validation run, eval loss 5.98).
TASK_VARIANTS = {"llm": {name: name + '@local_optimizer_kwargs={"routing":"hidden_only"}'
                         for name in ("local_muon", "fedmuon", "fedpac_muon")}}
# The tuning grids, as multiples of each algorithm's default lr: three decades around it, since the defaults come
# from papers on other models (e.g. Sophia's 3e-4 clips 96 % of its coordinates on digits).
LR_FACTORS = {"tweets": (1.0, 3.0, 10.0),  # upward only: at the defaults nothing left the majority class
              "digits": (0.1, 0.3, 1.0, 3.0, 10.0, 30.0),
              # the first 60-round grids (3x-100x, by answer accuracy) chose 3x or 10x, and FAdamGT's and
              # FedPAC_Muon's 1x scored higher still: three rungs from the default, extended at an edge
              "llm": (1.0, 3.0, 10.0)}
GRID_EXTENSIONS = 2  # steps beyond an edge, per tuning: each is one more seed-0 run
COMMON = dict(dirichlet_alpha=0.1, max_length=32)
HISTORY_KEYS = ("round", "train_loss", "eval_loss", "eval_accuracy", "eval_generation_accuracy", "learning_rate",
                "participants", "excluded_clients", "uplink_MB", "downlink_MB", "communicated_MB")


# ---------------------------------------------------------------- variants
def parse_variant(label: str):
    """``fedavg`` -> ("fedavg", {}); ``fedavg@learning_rate=1.0@server_rule=flora`` -> ("fedavg",
    {"learning_rate": 1.0, "server_rule": "flora"})."""
    name, *pairs = label.split("@")
    overrides = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:  # a bare word: a string (server_rule=fedex_lora)
            overrides[key] = value
    return name, overrides


# ---------------------------------------------------------------- one run
def run_settings(dataset: str, label: str, seed: int, budget: str, validation: bool = False,
                 budgets: dict = BUDGETS) -> dict:
    """One run's settings (stored with it: a stored run is reused only when they match). Every task trains in
    fp32: on the AVX2 CPU of these results bf16 autocast made a MiniLM-LoRA step 17x slower (lora_federation.py)."""
    settings = {"dataset": dataset, "algorithm": label, "seed": seed, "budget": budget, **COMMON,
                **budgets[budget][dataset], "bf16": False}
    return {**settings, "validation": True} if validation else settings  # old stored runs keep matching


def run_one(settings: dict, data: dict) -> dict:
    """Train one configuration; returns its record (history, wall time, split summary)."""
    name, overrides = parse_variant(settings["algorithm"])
    with tempfile.TemporaryDirectory(prefix="fedhf-bench-") as out:
        args = FederatedConfig(
            output_dir=out, algorithm=name, seed=settings["seed"], num_clients=settings["num_clients"],
            clients_per_round=settings["clients_per_round"], num_rounds=settings["num_rounds"],
            local_steps=settings["local_steps"], per_device_train_batch_size=settings["batch_size"],
            per_device_eval_batch_size=128, partition="dirichlet", dirichlet_alpha=settings["dirichlet_alpha"],
            bf16=settings["bf16"], use_cpu=True, eval_on_start=True,
            eval_every_rounds=settings.get("eval_every_rounds", 1), partition_report=False,
            report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no",
            dataloader_num_workers=0, partition_max_retries=1000, **overrides)  # retries: only draws that failed change
        # fedhf's own Dirichlet split (what the trainer would draw), over rows served from memory
        parts, split = partition_dataset(data["arrow_train"], args)
        classifier = not settings["dataset"].startswith("llm")
        trainer = FederatedTrainer(model=build_model(settings["dataset"], settings["seed"], data), args=args,
                                   train_dataset=data["train"], eval_dataset=data["test"], client_partitions=parts,
                                   data_collator=data["collator"], processing_class=data["tokenizer"],
                                   compute_metrics=accuracy_metrics if classifier else None,
                                   callbacks=data["callbacks"])
        trainer.remove_callback(transformers.PrinterCallback)  # one progress line per run instead
        load_before, start = os.getloadavg()[0], time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
    history = [{k: v for k, v in entry.items() if k in HISTORY_KEYS or k.startswith("precond_drift")}
               for entry in trainer.federated_history]
    labels = np.asarray([row["label"] for row in data["test"]])
    return {"settings": settings, "wall_s": wall, "history": history, "threads": torch.get_num_threads(),
            "load_average_1min": [load_before, os.getloadavg()[0]], "fedhf_commit": code_version(),
            "majority_accuracy": float(np.bincount(labels).max() / len(labels)),
            "algorithm_description": trainer.algorithm.describe(),
            "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "client_sizes": split["sizes"], "label_skew": split["label_skew"]}


def final_score(record: dict) -> float:
    """The task's score after the last round, as a number to maximise (a loss is negated; NaN ranks last)."""
    key, sense = SCORE[record["settings"]["dataset"]]
    value = record["history"][-1].get(key, float("nan"))
    value = value if sense == "max" else -value
    return value if np.isfinite(value) else -float("inf")


# ---------------------------------------------------------------- learning-rate tuning
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


def code_version() -> str:
    """The git commit of the fedhf checkout, "+dirty" when fedhf/ has uncommitted changes."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--", "../fedhf") else "")


def run_path(runs_dir: str, settings: dict) -> str:
    prefix = "validation_seed" if settings.get("validation") else "seed"
    return os.path.join(runs_dir, settings["dataset"], settings["algorithm"], f"{prefix}{settings['seed']}.json")


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


def stored_tuning(runs_dir: str) -> dict:
    """{task: {algorithm: tuning summary}} of every stored tuning."""
    tuning = {}
    for dataset in TASKS:
        folder = os.path.join(runs_dir, "tuning", dataset)
        for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            with open(os.path.join(folder, file)) as f:
                tuning.setdefault(dataset, {})[file[:-5]] = json.load(f)
    return tuning


class Runner:
    """``runner(settings)``: the stored run of ``settings``, or trained now and stored; None when it crashed (the
    traceback is kept and printed: a crash is a finding, and the other runs go on). Data is loaded once per task."""

    def __init__(self, runs_dir: str):
        self.runs_dir, self.failures, self.loaded = runs_dir, [], {}

    def data(self, settings: dict) -> dict:
        dataset, validation = settings["dataset"], settings.get("validation", False)
        if (dataset, validation) not in self.loaded:
            data = load_data(dataset, settings)
            self.loaded[dataset, validation] = with_validation(dataset, data) \
                if validation and not dataset.startswith("llm") else data
        return self.loaded[dataset, validation]

    def __call__(self, settings: dict):
        path, dataset = run_path(self.runs_dir, settings), settings["dataset"]
        record, status = cached(path, settings), "cached"
        if record is None:
            try:
                record, status = run_one(settings, self.data(settings)), "ran"
            except Exception:
                self.failures.append(f"{dataset} {settings['algorithm']} seed {settings['seed']}:\n"
                                     f"{traceback.format_exc()}")
                print(self.failures[-1], file=sys.stderr, flush=True)
                return None
            write_json_atomic(record, path)
        final, key = record["history"][-1], ACCURACY[dataset]
        print(f"{dataset:6s} {settings['algorithm']:30s} {'val ' if settings.get('validation') else ''}seed "
              f"{settings['seed']}: {key} {final.get(key, float('nan')):.3f} eval_loss "
              f"{final.get('eval_loss', float('nan')):.3f} {final['communicated_MB']:8.1f} MB "
              f"{record['wall_s']:6.1f} s ({status})", flush=True)
        return record

    def exit_on_failures(self) -> None:
        if self.failures:
            print(f"{len(self.failures)} run(s) failed; see the tracebacks above.", file=sys.stderr)
            sys.exit(1)


def cached(path: str, settings: dict):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        record = json.load(f)
    return record if record.get("settings") == settings else None


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
