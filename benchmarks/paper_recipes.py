"""The paper recipes run to their end: each seed paper's main comparison, our figure beside the paper's
(benchmarks/paper_recipes_result.md).

Every row is one command of a recipe's header -- ``fedhf train --config recipes/<recipe>.yaml`` for the paper's
algorithm and the same with ``--algorithm <baseline> --algorithm_kwargs ...`` for each baseline -- run as its own
process with its output under ``outputs/paper_recipes/<recipe>/<row>/``. A row whose ``federated_history.json``
already has the recipe's last round is read, not rerun, so an interrupted run resumes. The recipes keep each
paper's federated setting and replace only the data and model (CIFAR / ResNet-18 -> digits / a tiny ConvNeXt,
RoBERTa / SST-2 -> MiniLM-LoRA / tweets; each header says what and why), so the numbers are not comparable with the
paper's; the ORDERING of the rows is what can be compared, and the table says where it agrees.

    python benchmarks/paper_recipes.py [--recipes fedpac_table1,fadamgt_table1,...] [--seeds 3]

Writes ``paper_recipes_result.md`` beside this script (the table, with the machine and the wall time of each row).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from fedhf.metrics import write_json_atomic

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESET = ["--algorithm_kwargs", "{}"]  # a baseline at its own defaults (the papers' Table 8 rows, docs/algorithms.md 2)

# recipe -> what the paper reports, and its rows: name -> (command-line overrides, the paper's figure).
# "final": test accuracy after the last round; "best": the best evaluated accuracy over rounds; "rounds_to": the
# first evaluated round at or above ``target`` (lower is better).
COMPARISONS = {
    "fedpac_table1_digits_convnext_dir0.1_n100": dict(
        paper="FedPAC Table 1 (ResNet-18, CIFAR-100, Dir-0.1, 300 rounds), test accuracy %", metric="final",
        rows={"FedPAC_Muon": ([], 71.85),
              "Local Muon": (["--algorithm", "local_muon", *RESET], 67.26),
              "FedAvg": (["--algorithm", "fedavg", *RESET], 60.17)}),
    "fedmuon_table2_digits_convnext_dir0.1_n100": dict(
        paper="FedMuon Table 2 (ResNet-18, CIFAR-100, Dir-0.1, 300 rounds), test accuracy %", metric="final",
        rows={"FedMuon": ([], 73.05),
              "Local Muon": (["--algorithm", "local_muon", *RESET], 66.71),
              "FedAvg": (["--algorithm", "fedavg", *RESET], 60.25)}),
    "fadamgt_table1_digits_convnext_dir0.1_n100": dict(
        paper="FAdamGT Table 1 (ResNet-18, CIFAR-10, Dir-0.1), rounds to 75 % test accuracy", metric="rounds_to",
        target=0.75,
        rows={"FAdamGT": ([], 310.0),
              "SCAFFOLD": (["--algorithm", "scaffold", "--algorithm_kwargs", '{"lr": 0.1}'], 561.8),
              "LocalAdam": (["--algorithm", "local_adamw", "--algorithm_kwargs",
                             '{"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 1e-8}'], 589.5),
              "FedAvg": (["--algorithm", "fedavg", "--algorithm_kwargs", '{"lr": 0.1}'], 1388.5)}),
    "fedpm_table3_digits_convnext_dir0.1_n10": dict(
        paper="FedPM Table 3 (simple CNN, CIFAR-10, stronger heterogeneity), best test accuracy %", metric="best",
        rows={"FedPM": ([], 68.6),
              "LocalNewton": (["--algorithm", "localnewton"], 62.4),
              "FedAvg": (["--algorithm", "fedavg", "--algorithm_kwargs", '{"lr": 0.1, "weight_decay": 1e-4}'],
                         63.1)}),
    "prefed_fig1_digits_convnext_iid_n10": dict(
        paper="PreFed Figure 1 (ResNet-18, CIFAR-10, i.i.d.), test accuracy % (PreFed and PreFedOpt: 88 and 87, "
              "the text does not say which is which; FedAvg not given)", metric="final",
        rows={"PreFed": ([], 88.0),
              "PreFedOpt": (["--algorithm", "prefedopt", *RESET], 87.0),
              # Alg. 3 as written steps eta_g D / sqrt(P + tau) with D the per-step mean update: at K = 500 and
              # tau 1e-3 that is ~Delta / 316 a round, so the paper's eta_g 0.05 leaves the model where it was.
              # eta_g = K sqrt(tau) = 15.8 makes the step ~Delta (FedAvg's) while tau dominates: not the paper's.
              "PreFedOpt, eta_g 15.8": (["--algorithm", "prefedopt", "--algorithm_kwargs", '{"server_lr": 15.8}'],
                                        None),
              "FedAvg": (["--algorithm", "fedavg", "--algorithm_kwargs",
                          '{"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0}'], None)}),
    "fedmuon_table4_tweets_minilm_lora_dir0.8_n4": dict(
        paper="FedMuon Table 4 (RoBERTa-Base + LoRA, SST-2, Dir-0.8, 100 rounds), test accuracy %", metric="final",
        rows={"FedMuon": ([], 94.12),
              "Local Muon": (["--algorithm", "local_muon", "--algorithm_kwargs", '{"muon_lr_mult": 10.0}'], 93.34),
              "FedAvg": (["--algorithm", "fedavg", *RESET], 93.32)}),
}
# The LoRA recipe costs ~40 CPU-minutes a row (200 MiniLM steps a round): asked for by name, not run by default.
DEFAULT_RECIPES = [name for name in COMPARISONS if "minilm" not in name]


def recipe_train(recipe: str) -> dict:
    """The recipe's ``train:`` section."""
    import yaml

    with open(os.path.join(ROOT, "recipes", recipe + ".yaml")) as f:
        return yaml.safe_load(f)["train"]


def run_row(recipe: str, row: str, overrides: list, seed: int, runs_dir: str) -> dict:
    """Train one row (or read it back); returns {"history", "wall_s", "command"}."""
    out = os.path.join(runs_dir, recipe, f"{row.replace(' ', '_')}_seed{seed}")
    done = os.path.join(out, "row.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    command = [sys.executable, "-m", "fedhf", "train", "--config", os.path.join("recipes", recipe + ".yaml"),
               *overrides, "--seed", str(seed), "--output_dir", out, "--overwrite_output_dir", "true"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "federated_history.json")) as f:
        history = json.load(f)
    if history[-1]["round"] != recipe_train(recipe)["num_rounds"]:
        raise RuntimeError(f"{recipe} {row}: stopped at round {history[-1]['round']}")
    record = {"history": history, "wall_s": time.perf_counter() - start,
              "command": " ".join(command[1:]).replace(sys.executable, "python")}
    write_json_atomic(record, done)  # a run killed while writing leaves no half row for the resume to trust
    return record


def score(history: list, metric: str, target: float = None):
    """The paper's metric on our history (accuracy as %, or a round number; None: target never reached)."""
    evaluated = [h for h in history if "eval_accuracy" in h]
    if metric == "final":
        return 100 * evaluated[-1]["eval_accuracy"]
    if metric == "best":
        return 100 * max(h["eval_accuracy"] for h in evaluated)
    return next((h["round"] for h in evaluated if h["eval_accuracy"] >= target), None)


def ordering(values: dict, lower_is_better: bool) -> list:
    """Row names from best to worst (rows without a value last)."""
    known = {k: v for k, v in values.items() if v is not None}
    ranked = sorted(known, key=known.get, reverse=not lower_is_better)
    return ranked + [k for k in values if k not in known]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def report(results: dict, seeds: int) -> str:
    lines = [f"Machine: {cpu_name()}, {os.cpu_count()} cores; {seeds} seed(s) a row "
             "(the recipe's own and the next ones); each row one process (`OMP_NUM_THREADS=1`).", ""]
    for recipe, spec in results.items():
        lower = spec["metric"] == "rounds_to"
        unit = f"rounds to {spec['target']:.2f}" if lower else f"{spec['metric']} accuracy %"
        lines += [f"### {recipe}", "", f"Paper: {spec['paper']}.", "",
                  f"| row | paper | ours ({unit}, per seed) | ours, mean | MB | wall s |", "|---|---|---|---|---|---|"]
        ours = {}
        for row, records in spec["records"].items():
            values = [score(r["history"], spec["metric"], spec.get("target")) for r in records]
            reached = [v for v in values if v is not None]
            complete = reached and len(reached) == len(values)
            ours[row] = statistics.mean(reached) if complete else None
            spread = f" ± {statistics.stdev(reached):.1f}" if complete and len(reached) > 1 else ""
            per_seed = ", ".join("-" if v is None else f"{v:.1f}" if not lower else str(v) for v in values)
            paper = spec["rows"][row][1]
            lines.append(f"| {row} | {'-' if paper is None else paper} | {per_seed} | "
                         f"{'-' if ours[row] is None else f'{ours[row]:.1f}{spread}'} | "
                         f"{records[0]['history'][-1]['communicated_MB']:.1f} | "
                         f"{sum(r['wall_s'] for r in records) / len(records):.0f} |")
        compared = [row for row in ours if spec["rows"][row][1] is not None]  # rows the paper gives a figure for
        paper_order = ordering({row: spec["rows"][row][1] for row in compared}, lower)
        our_order = ordering({row: ours[row] for row in compared}, lower)
        agree = "the same" if paper_order == our_order else "different"
        lines += ["", f"Ordering, paper: {' > '.join(paper_order)}; ours: {' > '.join(our_order)} ({agree}).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                        help=f"Prefixes of {list(COMPARISONS)}.")
    parser.add_argument("--seeds", type=int, default=3,
                        help="How many seeds: the recipe's own and the next ones (FedPAC/FedMuon: 42, 43, ...).")
    parser.add_argument("--runs_dir", default=os.path.join(ROOT, "outputs", "paper_recipes"))
    parser.add_argument("--result", default=os.path.join(HERE, "paper_recipes_result.md"))
    cli = parser.parse_args()
    chosen = [name for prefix in cli.recipes.split(",") if prefix for name in COMPARISONS if name.startswith(prefix)]
    if not chosen:
        parser.error(f"--recipes: none of {list(COMPARISONS)} starts with {cli.recipes!r}")
    results = {}
    for recipe in chosen:
        spec = dict(COMPARISONS[recipe])
        first = recipe_train(recipe).get("seed", 42)
        seeds = list(range(first, first + cli.seeds))
        spec["records"] = {}
        for row, (overrides, _) in spec["rows"].items():
            spec["records"][row] = [run_row(recipe, row, overrides, seed, cli.runs_dir) for seed in seeds]
            print(f"{recipe} {row}: done ({len(seeds)} seed(s))", flush=True)
        results[recipe] = spec
    text = report(results, cli.seeds)
    with open(cli.result, "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
