"""The algorithm comparison on a real LLM: Gemma-3-270M + LoRA, non-IID tweets as instructions, ten algorithms.

    python benchmarks/llm_comparison.py                 # every run not stored yet, in order (resumable)
    python benchmarks/llm_comparison.py --algorithms fedavg scaffold   # a share of them (one process per core)
    python benchmarks/llm_comparison_report.py          # the table from whatever is stored (pending runs marked)

Task: the bundled Gemma-3-270M (base in bfloat16 where the hardware multiplies it, else float32; examples/sft_llm.py's
model) with LoRA r8 on q_proj/v_proj (alpha 16, no dropout: every trainable tensor is a hidden matrix, so Muon's
``ndim>=2`` and ``hidden_only`` routings coincide); the bundled tweets as instructions ("Tweet: ...\nSentiment:" ->
" positive"), 2,000 training rows split Dirichlet(0.1) over the sentiment across 20 clients, 4 a round, 8 rounds x 4
local steps x 4 rows, max 64 tokens. The budget is chosen so that a run, scoring included, takes at most 5 minutes at
one thread on a quiet 2-core machine (each run stores its times). The rows are the same for every run; the seed draws
the LoRA init, the split and the cohorts.

Each run is scored once, after its last round (the base model, which every run starts from since LoRA's B is zero, is
scored once, ``base.json``): on the test split, the log-likelihood accuracy of the three answers and the mean
log-probability of the right one over ``loglik_rows`` rows (docs/llm.md), the greedy answer's accuracy (first word,
and FlowerTune's finance rule) and its unparseable rate over the first ``generation_rows`` of them, and eval loss over
``eval_rows`` other rows; on ``validation_rows`` rows of the training split that no client holds, the log-likelihood
scores. The lr is chosen by the validation log-likelihood accuracy (ties: the higher mean log-probability
of the right answer), never by the test rows.

Phases, in this order: ``defaults`` (every algorithm at its default lr, seed 0), ``brackets`` (x1/3 and x3 of the
default, seed 0), ``seeds`` (seeds 1 and 2 at the chosen lr; an algorithm whose bracket is unfinished waits).
Every run is stored as JSON under benchmarks/llm_comparison_runs/ as it finishes, with its settings; a stored run
is reused only while its settings are the current ones, so the comparison can be stopped and resumed, and two
processes given disjoint ``--algorithms`` share the work.
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
from lr_tuning import default_lr, grid_labels  # noqa: E402

from fedhf.algorithms import get_algorithm, list_algorithms  # noqa: E402

ALGORITHMS = ("fedavg", "local_adamw", "scaffold", "fedpac_muon", "fedmuon", "local_muon", "fadam_gt", "diloco",
              "muloco", "desloc")
LR_FACTORS = (1 / 3, 1.0, 3.0)
SEEDS = (0, 1, 2)
RUNS_DIR = os.path.join(HERE, "llm_comparison_runs")
TASK = {"model": "bundled-gemma-3-270m", "lora_r": 8, "lora_targets": "q_proj,v_proj", "train_rows": 2000,
        "max_length": 64, "num_clients": 20, "clients_per_round": 4, "dirichlet_alpha": 0.1, "num_rounds": 8,
        "local_steps": 4, "batch_size": 4, "eval_rows": 64, "loglik_rows": 1000, "generation_rows": 100,
        "validation_rows": 200}
CHOICES = (" negative", " neutral", " positive")  # the tweets' answers as the completions write them


# ---------------------------------------------------------------- the plan


def run_settings(label: str, seed: int) -> dict:
    """A run's settings, stored with it: the task, the label, the seed, the lr it trains at and the algorithm's
    registered defaults (server lr, betas, ...), so that a changed default makes its stored runs stale."""
    name, overrides = parse_variant(label)
    return {**TASK, "algorithm": label, "seed": seed, "learning_rate": overrides.get("learning_rate", default_lr(name)),
            "defaults": get_algorithm(name).describe()}


def run_path(settings: dict, runs_dir: str = RUNS_DIR) -> str:
    return os.path.join(runs_dir, settings["algorithm"], f"seed{settings['seed']}.json")


def load_run(label: str, seed: int, runs_dir: str = RUNS_DIR):
    settings = run_settings(label, seed)
    return cached(run_path(settings, runs_dir), settings)


def bracket(name: str) -> dict:
    """{lr: label} of the x1/3, x1, x3 bracket around ``name``'s default lr (the default keeps the bare name)."""
    return grid_labels(name, LR_FACTORS)


def validation_score(record: dict) -> tuple:
    """What the lr is chosen by: validation log-likelihood accuracy, then the higher mean log-probability of the
    right answer (NaN ranks last)."""
    acc, logprob = record["validation"]["loglik_accuracy"], record["validation"]["loglik_answer_logprob"]
    return (acc, logprob if logprob == logprob else -float("inf"))


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
    """Tokenised train / test-loss / validation rows, and the (prompts, answers) of the scored test and validation
    rows."""
    from transformers import AutoTokenizer

    from fedhf.data import bundled_gemma
    from fedhf.data.demo import TWEET_LABELS, load_tweet_instructions
    from fedhf.data.sft import tokenize_sft

    path = bundled_gemma.gemma_3_270m_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    splits = load_tweet_instructions()
    pool = splits["train"].shuffle(seed=0)  # the first train_rows train; the next validation_rows validate
    n, v = task["train_rows"], task["validation_rows"]
    test = splits["test"].shuffle(seed=0)  # the first eval_rows give eval loss; the next loglik_rows are scored
    e, k = task["eval_rows"], task["loglik_rows"]
    if len(pool) < n + v or len(test) < e + k:
        raise SystemExit(f"the tweets have {len(pool)} training and {len(test)} test rows, fewer than {n} + {v} and "
                         f"{e} + {k}")
    validation = pool.select(range(n, n + v))

    def pairs(rows):  # answers written as the completions and the log-likelihood choices are: " positive"
        return list(rows["prompt"]), [" " + TWEET_LABELS[y] for y in rows["label"]]

    tokenize = lambda rows: tokenize_sft(rows, tokenizer, max_length=task["max_length"])  # noqa: E731
    return {"path": path, "tokenizer": tokenizer, "train": tokenize(pool.select(range(n))),
            "test": tokenize(test.select(range(e))),
            "test_pairs": pairs(test.select(range(e, e + k))), "validation_pairs": pairs(validation)}


def build_model(task: dict, data: dict, seed: int):
    """examples/sft_llm.py's model: the pretrained base and a LoRA adapter drawn after ``torch.manual_seed(seed)``."""
    import torch
    from sft_llm import SFTArguments, load_model

    torch.manual_seed(seed)
    extras = SFTArguments(model_name_or_path=data["path"], lora_r=task["lora_r"], lora_targets=task["lora_targets"])
    return load_model(extras, data["tokenizer"], seed)


# ---------------------------------------------------------------- scoring and one run
def loglik_scores(model, tokenizer, pairs) -> dict:
    from fedhf.metrics import score_candidates

    prompts, answers = pairs
    scores = score_candidates(model, tokenizer, prompts, list(CHOICES), [CHOICES.index(a) for a in answers])
    return {"loglik_accuracy": scores.accuracy, "loglik_answer_logprob": scores.answer_logprob}


def generative_scores(model, tokenizer, pairs) -> dict:
    from fedhf.metrics import flowertune_accuracy, unparseable_rate
    from fedhf.metrics.generation import first_word_accuracy, generate_answers

    prompts, answers = pairs
    predictions = generate_answers(model, tokenizer, prompts, max_new_tokens=3, batch_size=16)
    return {"generation_accuracy": first_word_accuracy(predictions, answers),
            "flowertune_accuracy": flowertune_accuracy(predictions, answers),
            "generation_unparseable_rate": unparseable_rate(predictions, CHOICES)}


def score(trainer, data: dict, task: dict) -> dict:
    """The test and validation scores of the trainer's model (module docstring), and the seconds they took."""
    start, model, tokenizer = time.perf_counter(), trainer.model, data["tokenizer"]
    generation = [column[:task["generation_rows"]] for column in data["test_pairs"]]
    test = {"eval_loss": trainer.evaluate(eval_dataset=data["test"])["eval_loss"],
            **loglik_scores(model, tokenizer, data["test_pairs"]), **generative_scores(model, tokenizer, generation)}
    validation = loglik_scores(model, tokenizer, data["validation_pairs"])
    return {"test": test, "validation": validation, "score_s": time.perf_counter() - start}


def make_trainer(settings: dict, data: dict, out: str):
    import transformers

    from fedhf import FederatedConfig, FederatedTrainer
    from fedhf.data.sft import SFTCollator

    name, overrides = parse_variant(settings["algorithm"])
    args = FederatedConfig(
        output_dir=out, algorithm=name, seed=settings["seed"], num_clients=settings["num_clients"],
        clients_per_round=settings["clients_per_round"], num_rounds=settings["num_rounds"],
        local_steps=settings["local_steps"], per_device_train_batch_size=settings["batch_size"],
        gradient_accumulation_steps=1, per_device_eval_batch_size=16, partition="dirichlet",
        partition_column="label", dirichlet_alpha=settings["dirichlet_alpha"], use_cpu=True,
        partition_report=False, report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no",
        dataloader_num_workers=0, **overrides)
    trainer = FederatedTrainer(model=build_model(settings, data, settings["seed"]), args=args,
                               train_dataset=data["train"], data_collator=SFTCollator(data["tokenizer"]),
                               processing_class=data["tokenizer"])
    trainer.remove_callback(transformers.PrinterCallback)
    return trainer


def run_one(settings: dict, data: dict) -> dict:
    import torch

    with tempfile.TemporaryDirectory(prefix="fedhf-llm-comparison-") as out:
        trainer = make_trainer(settings, data, out)
        start = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - start
        scores = score(trainer, data, settings)
    history = [{k: v for k, v in entry.items() if k in HISTORY_KEYS} for entry in trainer.federated_history]
    return {"settings": settings, "wall_s": wall, **scores, "history": history, "threads": torch.get_num_threads(),
            "fedhf_commit": code_version(), "algorithm_description": trainer.algorithm.describe(),
            "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "load_average_1min": os.getloadavg()[0]}


def base_run(data: dict) -> dict:
    """The scores of the model every run starts from (seed 0's LoRA init: B is zero, so the base itself)."""
    settings = {**TASK, "algorithm": "base model", "seed": 0}
    with tempfile.TemporaryDirectory(prefix="fedhf-llm-comparison-") as out:
        trainer = make_trainer({**settings, "algorithm": "fedavg"}, data, out)
        return {"settings": settings, **score(trainer, data, settings), "fedhf_commit": code_version()}


def load_base(runs_dir: str = RUNS_DIR):
    return cached(os.path.join(runs_dir, "base.json"), {**TASK, "algorithm": "base model", "seed": 0})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("all", "defaults", "brackets", "seeds"), default="all")
    # any registered algorithm runs at this budget (docs/llm.md checks FOOF's lr with `--algorithms fedpm --phase
    # defaults`); the report shows the ten of ALGORITHMS
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list_algorithms())
    parser.add_argument("--runs_dir", default=RUNS_DIR)
    opts = parser.parse_args(argv)

    from fedhf.metrics import write_json_atomic

    data, failures = None, []
    if load_base(opts.runs_dir) is None and opts.phase in ("all", "defaults") and "fedavg" in opts.algorithms:
        data = load_data(TASK)
        write_json_atomic(base_run(data), os.path.join(opts.runs_dir, "base.json"))
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
        test, validation = record["test"], record["validation"]
        print(f"{label:32s} seed {seed}: test loglik acc {test['loglik_accuracy']:.3f} gen acc "
              f"{test['generation_accuracy']:.3f} loss {test['eval_loss']:.3f} | val loglik acc "
              f"{validation['loglik_accuracy']:.3f} | {record['history'][-1]['uplink_MB']:.1f} MB up, "
              f"{record['wall_s']:.0f} + {record['score_s']:.0f} s ({status})", flush=True)
    if failures:
        print(f"{len(failures)} run(s) failed; see the tracebacks above.", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
