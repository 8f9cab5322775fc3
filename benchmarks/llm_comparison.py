"""The algorithm comparison on a real LLM: Gemma-3-270M + LoRA, non-IID tweets as instructions, nine algorithms.

    python benchmarks/llm_comparison.py                 # every run not stored yet, in order (resumable)
    python benchmarks/llm_comparison.py --phase defaults --algorithms diloco muloco
    python benchmarks/llm_comparison_report.py          # the table from whatever is stored (pending runs marked)

Task (the ``make demo-llm`` budget, examples/sft_llm.py): the bundled Gemma-3-270M (base in bfloat16 where the
hardware multiplies it, else float32) with LoRA r8 on q_proj/v_proj (alpha 16, no dropout: every trainable tensor is
a hidden matrix, so Muon's ``ndim>=2`` and ``hidden_only`` routings coincide); the bundled tweets as instructions
("Tweet: ...\\nSentiment:" -> " positive"), 2,000 training rows split Dirichlet(0.1) over the sentiment across 20
clients, 4 a round, 8 rounds x 5 local steps x 8 rows, max 64 tokens. The rows are the same for every run; the seed
draws the LoRA init, the split and the cohorts.

Each run is scored three ways: on the test split, eval loss over ``eval_rows`` rows and greedy-answer accuracy (first
word) over ``generation_rows`` other rows, at rounds 0, 2, 4, 6, 8; and once after the last round, the same two on
``validation_rows`` rows of the training split that no client holds. The lr is chosen by that validation accuracy
(ties: lower validation loss), never by the test rows.

Phases, in this order: ``defaults`` (every algorithm at its default lr, seed 0), ``brackets`` (x1/3 and x3 of the
default, seed 0), ``seeds`` (seeds 1 and 2 at the chosen lr; an algorithm whose bracket is unfinished waits).
Every run is stored as JSON under benchmarks/llm_comparison_runs/ as it finishes, with its settings; a stored run
is reused only while its settings are the current ones, so the comparison can be stopped and resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
# this checkout's fedhf, benchmark helpers and example, whatever fedhf is installed
sys.path[:0] = [HERE, os.path.join(HERE, ".."), os.path.join(HERE, "..", "examples")]
from algorithm_runs import HISTORY_KEYS, cached, code_version, parse_variant  # noqa: E402
from lr_tuning import grid_labels  # noqa: E402

ALGORITHMS = ("fedavg", "local_adamw", "scaffold", "fedpac_muon", "fedmuon", "local_muon", "fadam_gt", "diloco",
              "muloco")
LR_FACTORS = (1 / 3, 1.0, 3.0)
SEEDS = (0, 1, 2)
RUNS_DIR = os.path.join(HERE, "llm_comparison_runs")
TASK = {"model": "bundled-gemma-3-270m", "lora_r": 8, "lora_targets": "q_proj,v_proj", "train_rows": 2000,
        "max_length": 64, "num_clients": 20, "clients_per_round": 4, "dirichlet_alpha": 0.1, "num_rounds": 8,
        "local_steps": 5, "batch_size": 8, "eval_every_rounds": 2, "eval_rows": 64, "generation_rows": 100,
        "validation_rows": 100}


# ---------------------------------------------------------------- the plan
LOGLIK_KEYS = ("eval_loglik_accuracy", "eval_loglik_answer_logprob", "eval_generation_unparseable_rate")
# DiLoCo and MuLoCo keep each client's inner optimizer state since the presets became faithful (docs/algorithms.md
# 2.16); their runs stored before then reset it every round, so their settings name the change and they rerun.
KEPT_INNER_STATE = ("diloco", "muloco")


def run_settings(label: str, seed: int) -> dict:
    settings = {**TASK, "algorithm": label, "seed": seed}
    if parse_variant(label)[0] in KEPT_INNER_STATE:
        settings["inner_state"] = "kept"
    return settings


def run_path(settings: dict, runs_dir: str = RUNS_DIR) -> str:
    return os.path.join(runs_dir, settings["algorithm"], f"seed{settings['seed']}.json")


def load_run(label: str, seed: int, runs_dir: str = RUNS_DIR):
    settings = run_settings(label, seed)
    return cached(run_path(settings, runs_dir), settings)


def bracket(name: str) -> dict:
    """{lr: label} of the x1/3, x1, x3 bracket around ``name``'s default lr (the default keeps the bare name)."""
    return grid_labels(name, LR_FACTORS)


def validation_score(record: dict) -> tuple:
    """What the lr is chosen by: validation accuracy, then lower validation loss (NaN ranks last)."""
    acc, loss = record["validation"]["eval_generation_accuracy"], record["validation"]["eval_loss"]
    finite = loss == loss and loss != float("inf")
    return (acc, -loss if finite else -float("inf"))


def chosen_label(name: str, runs_dir: str = RUNS_DIR):
    """The bracket's label with the best validation score on seed 0, or None while a bracket run is missing."""
    records = {label: load_run(label, 0, runs_dir) for label in bracket(name).values()}
    if any(r is None for r in records.values()):
        return None
    return max(records, key=lambda label: validation_score(records[label]))


def plan(phase: str, algorithms, runs_dir: str = RUNS_DIR):
    """(label, seed) of the runs of ``phase`` ("all": defaults, then brackets, then seeds), in order. A generator:
    an algorithm's seeds are resolved when they are reached, after its bracket ran (one unfinished is skipped)."""
    if phase in ("all", "defaults"):
        yield from ((name, 0) for name in algorithms)
    if phase in ("all", "brackets"):
        yield from ((label, 0) for name in algorithms for label in bracket(name).values() if label != name)
    if phase in ("all", "seeds"):
        for name in algorithms:
            chosen = chosen_label(name, runs_dir)
            if chosen is None:
                print(f"{name}: bracket unfinished, its seeds wait", flush=True)
                continue
            yield from ((chosen, seed) for seed in SEEDS)  # seed 0 at the chosen lr is a bracket run already


# ---------------------------------------------------------------- data and model
def load_data(task: dict) -> dict:
    """Tokenised train / test-loss / validation-loss rows and the (prompt, answer) pairs of both generation sets."""
    from transformers import AutoTokenizer

    from fedhf.data import bundled_gemma
    from fedhf.data.demo import TWEET_LABELS, load_tweet_instructions
    from fedhf.data.sft import tokenize_sft

    path = bundled_gemma.gemma_3_270m_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    splits = load_tweet_instructions()
    pool = splits["train"].shuffle(seed=0)  # the first train_rows train; the next validation_rows validate
    n, v = task["train_rows"], task["validation_rows"]
    if len(pool) < n + v:
        raise SystemExit(f"the tweets have {len(pool)} training rows, fewer than {n} + {v} validation rows")
    train, validation = pool.select(range(n)), pool.select(range(n, n + v))
    test = splits["test"].shuffle(seed=0)
    held = test.select(range(task["eval_rows"]))
    generation = test.select(range(task["eval_rows"], task["eval_rows"] + task["generation_rows"]))

    def pairs(rows):  # answers written as the completions and the log-likelihood choices are: " positive"
        return list(rows["prompt"]), [" " + TWEET_LABELS[y] for y in rows["label"]]

    tokenize = lambda rows: tokenize_sft(rows, tokenizer, max_length=task["max_length"])  # noqa: E731
    return {"path": path, "tokenizer": tokenizer, "train": tokenize(train), "test": tokenize(held),
            "validation": tokenize(validation), "test_pairs": pairs(generation), "validation_pairs": pairs(validation)}


def build_model(task: dict, data: dict, seed: int):
    """examples/sft_llm.py's model: the pretrained base and a LoRA adapter drawn after ``torch.manual_seed(seed)``."""
    import torch
    from sft_llm import SFTArguments, load_model

    torch.manual_seed(seed)
    extras = SFTArguments(model_name_or_path=data["path"], lora_r=task["lora_r"], lora_targets=task["lora_targets"])
    return load_model(extras, data["tokenizer"], seed)


# ---------------------------------------------------------------- one run
def run_one(settings: dict, data: dict) -> dict:
    import torch
    import transformers

    from fedhf import FederatedConfig, FederatedTrainer
    from fedhf.data.sft import SFTCollator
    from fedhf.metrics import GenerationEvalCallback

    name, overrides = parse_variant(settings["algorithm"])
    tokenizer = data["tokenizer"]
    from fedhf.data.demo import TWEET_LABELS

    # the generative score and, parser-free, the log-likelihood of the three answers (docs/llm.md)
    scorer = GenerationEvalCallback(tokenizer, *data["test_pairs"], choices=[" " + t for t in TWEET_LABELS])
    with tempfile.TemporaryDirectory(prefix="fedhf-llm-comparison-") as out:
        args = FederatedConfig(
            output_dir=out, algorithm=name, seed=settings["seed"], num_clients=settings["num_clients"],
            clients_per_round=settings["clients_per_round"], num_rounds=settings["num_rounds"],
            local_steps=settings["local_steps"], per_device_train_batch_size=settings["batch_size"],
            gradient_accumulation_steps=1, per_device_eval_batch_size=16, partition="dirichlet",
            partition_column="label", dirichlet_alpha=settings["dirichlet_alpha"], use_cpu=True,
            eval_on_start=True, eval_every_rounds=settings["eval_every_rounds"], partition_report=False,
            report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no",
            dataloader_num_workers=0, **overrides)
        trainer = FederatedTrainer(model=build_model(settings, data, settings["seed"]), args=args,
                                   train_dataset=data["train"], eval_dataset=data["test"],
                                   data_collator=SFTCollator(tokenizer), processing_class=tokenizer,
                                   callbacks=[scorer])
        trainer.remove_callback(transformers.PrinterCallback)
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
        # the final model on the validation rows: the same scorer, pointed at their prompts
        scorer.prompts, scorer.answers = data["validation_pairs"]
        validation = trainer.evaluate(eval_dataset=data["validation"])
    kept = HISTORY_KEYS + LOGLIK_KEYS
    history = [{k: v for k, v in entry.items() if k in kept} for entry in trainer.federated_history]
    return {"settings": settings, "wall_s": wall, "history": history, "threads": torch.get_num_threads(),
            "validation": {k: validation[k] for k in ("eval_loss", "eval_generation_accuracy") + LOGLIK_KEYS},
            "fedhf_commit": code_version(), "algorithm_description": trainer.algorithm.describe(),
            "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "load_average_1min": os.getloadavg()[0]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("all", "defaults", "brackets", "seeds"), default="all")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--runs_dir", default=RUNS_DIR)
    opts = parser.parse_args(argv)

    from fedhf.metrics import write_json_atomic

    data, failures = None, []
    for label, seed in plan(opts.phase, opts.algorithms, opts.runs_dir):
        settings = run_settings(label, seed)
        path = run_path(settings, opts.runs_dir)
        record, status = cached(path, settings), "cached"
        if record is None:
            data = data or load_data(TASK)
            try:
                record, status = run_one(settings, data), "ran"
            except Exception:
                failures.append(f"{label} seed {seed}:\n{traceback.format_exc()}")
                print(failures[-1], file=sys.stderr, flush=True)
                continue
            write_json_atomic(record, path)
        final, validation = record["history"][-1], record["validation"]
        print(f"{label:32s} seed {seed}: test acc {final.get('eval_generation_accuracy', float('nan')):.3f} loss "
              f"{final.get('eval_loss', float('nan')):.3f} | val acc {validation['eval_generation_accuracy']:.3f} "
              f"loss {validation['eval_loss']:.3f} | {final['uplink_MB']:.1f} MB up, {record['wall_s']:.0f} s "
              f"({status})", flush=True)
    if failures:
        print(f"{len(failures)} run(s) failed; see the tracebacks above.", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
