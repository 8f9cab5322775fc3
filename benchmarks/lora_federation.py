"""LoRA aggregation rules compared: accuracy and eval loss per round and per communicated MB, over seeds.

Every method is one setting on the same named algorithm (fedavg, SGD at ``BASE_LR``), so the rows differ only in
how the clients' adapters are combined and what is sent (docs/lora_federation.md):

* ``fedavg``: A and B averaged apart (the naive rule: the mean of B_i times the mean of A_i);
* ``server_rule=fedex_lora`` (FedEx-LoRA, arXiv:2410.09432): the mean product, exact, residual folded into the base;
* ``server_rule=flora`` (FLoRA, arXiv:2409.05976): the mean product merged into the base, adapters restarted;
* ``server_rule=flexlora`` (FlexLoRA, arXiv:2402.11505): the mean product re-factorised by SVD at rank r;
* ``server_rule=fedsvd`` (FedSVD, arXiv:2505.12805): only B trained and sent, A refreshed orthonormal by an SVD;
* ``parameter_sharing=ffa`` (FFA-LoRA, arXiv:2403.12313): A frozen at a shared draw, only B trained and sent;
* ``parameter_sharing=rolora`` (RoLoRA, arXiv:2502.01755): B and A trained and sent in alternate rounds.

Tasks (benchmarks/comparison_tasks.py): ``tweets`` (pretrained MiniLM-L6 + LoRA r8 on query/value, 3-class
sentiment, Dirichlet 0.1 over 20 clients, 5 per round) and ``llm-lora`` (a small Llama built from a config, LoRA
r8 on every projection, SFT on the tweets as instructions, the same split). The runs are stored and resumed like
benchmarks/algorithms.py's; the learning rate is set by hand (``BASE_LR``), not tuned per rule. Every run is fp32:
on the AVX2 CPU these results come from, bf16 autocast made a MiniLM-LoRA step 17x slower (10.1 s against 0.59 s,
batch 16 x 32 tokens, one thread). The runs are kept apart from benchmarks/algorithms.py's (``--runs_dir``).

Outputs (``--budget full``): ``lora_federation_result.md`` (the tables, also printed), ``lora_federation.json``
and ``lora_federation_<task>.png`` beside this script; other budgets write them to
``outputs/benchmarks/lora_federation_<budget>/``.

    python benchmarks/lora_federation.py [--budget quick|full] [--tasks tweets,llm-lora] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from algorithm_runs import Runner, run_settings  # noqa: E402
from comparison_report import plot, summarize, table  # noqa: E402
from comparison_tasks import ACCURACY, HERE, LORA_BUDGETS, TARGETS  # noqa: E402

from fedhf.metrics import write_json_atomic  # noqa: E402

# SGD's lr per task: tweets' is the one tried for the quickstart (benchmarks/README.md: FedAvg-SGD lr 1.0 on this
# model and data); the Llama's LoRA-only adapters on a random base moved slowly at 1.0 on the quick budget.
BASE_LR = {"tweets": 1.0, "llm-lora": 3.0}
METHODS = {"fedavg": "", "fedex_lora": "@server_rule=fedex_lora", "flora": "@server_rule=flora",
           "flexlora": "@server_rule=flexlora", "fedsvd": "@server_rule=fedsvd", "ffa": "@parameter_sharing=ffa",
           "rolora": "@parameter_sharing=rolora"}


def label(task: str, method: str) -> str:
    return f"fedavg@learning_rate={BASE_LR[task]}{METHODS[method]}"


def paired_table(task: str, by_method: dict) -> str:
    """Each rule minus plain averaging on the same seed (same split, sampling and initial model), final round: the
    seed moves every rule together, so these differences are the comparison; the table above shows the spread."""
    def finals(method, key):
        return {r["settings"]["seed"]: r["history"][-1].get(key, float("nan")) for r in by_method.get(method, [])}

    keys = [ACCURACY[task], "eval_loss"]
    lines = ["Paired by seed, rule minus fedavg (mean ± std over seeds; per seed in brackets):", "",
             "| rule | " + " | ".join(f"Δ final {k}" for k in keys) + " |", "|---|" + "---|" * len(keys)]
    for method in [m for m in by_method if m != "fedavg"]:
        cells = []
        for key in keys:
            base, own = finals("fedavg", key), finals(method, key)
            diffs = [own[s] - base[s] for s in sorted(own) if s in base]
            spread = f" ± {np.std(diffs, ddof=1):.3f}" if len(diffs) > 1 else ""
            cells.append(f"{np.mean(diffs):+.3f}{spread} [{', '.join(f'{d:+.3f}' for d in diffs)}]" if diffs else "-")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", choices=sorted(LORA_BUDGETS), default="full")
    parser.add_argument("--tasks", default="tweets,llm-lora")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"Some of {list(METHODS)}.")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--runs_dir", default=None,
                        help="Per-run JSONs; default outputs/benchmarks/lora_federation/BUDGET.")
    parser.add_argument("--results_dir", default=None,
                        help="Where the table, JSON and plots go; default benchmarks/ for full, else outputs/.")
    cli = parser.parse_args()
    torch.set_num_threads(1)  # as benchmarks/algorithms.py: one thread was faster on the shared 2-core machine
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    runs_dir = cli.runs_dir or os.path.join("outputs", "benchmarks", "lora_federation", cli.budget)
    out_dir = cli.results_dir or (HERE if cli.budget == "full" else
                                  os.path.join("outputs", "benchmarks", f"lora_federation_{cli.budget}"))
    run, methods = Runner(runs_dir), [m for m in cli.methods.split(",") if m]
    text, summaries_all = [f"Budget `{cli.budget}`, torch {torch.__version__}, transformers {transformers.__version__},"
                           " fp32, 1 torch thread per run, 2-core AVX2 CPU.", ""], {}
    for task in [t for t in cli.tasks.split(",") if t]:
        by_method = {}
        for method in methods:
            records = [run(run_settings(task, label(task, method), int(seed), cli.budget, budgets=LORA_BUDGETS))
                       for seed in cli.seeds.split(",") if seed]
            by_method[method] = [r for r in records if r is not None]
        by_method = {m: rs for m, rs in by_method.items() if rs}
        if not by_method:
            continue
        runs = [r for rs in by_method.values() for r in rs]
        summaries_all[task] = {m: summarize(rs, TARGETS[task]) for m, rs in by_method.items()}
        text += [f"### {task}: fedavg (SGD, lr {BASE_LR[task]}) with each LoRA rule", "",
                 table(task, summaries_all[task], runs), "", paired_table(task, by_method)]
        os.makedirs(out_dir, exist_ok=True)
        plot(task, by_method, runs[0]["majority_accuracy"], os.path.join(out_dir, f"lora_federation_{task}.png"),
             f"{task}, LoRA rules")
    markdown = "\n".join(text)
    print(markdown)
    if summaries_all:
        write_json_atomic({"budget": cli.budget, "labels": {t: {m: label(t, m) for m in methods} for t in summaries_all},
                           "summaries": summaries_all}, os.path.join(out_dir, "lora_federation.json"))
        with open(os.path.join(out_dir, "lora_federation_result.md"), "w") as f:
            f.write(markdown)
    run.exit_on_failures()


if __name__ == "__main__":
    main()
