"""One run of the algorithm comparison (benchmarks/algorithms.py): its settings, the training, and its store.

Every (task, algorithm, seed) run is stored as its own JSON under a runs directory, with the settings it was made
at; a stored run is reused only while those settings are the current code's.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from fedhf import FederatedConfig, FederatedTrainer  # noqa: E402
from fedhf.data import partition_dataset  # noqa: E402
from fedhf.metrics import accuracy_metrics, write_json_atomic  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comparison_tasks import ACCURACY, BUDGETS, HERE, SCORE, build_model, load_data, with_validation  # noqa: E402

COMMON = dict(dirichlet_alpha=0.1, max_length=32)
HISTORY_KEYS = ("round", "train_loss", "eval_loss", "eval_accuracy", "eval_generation_accuracy", "learning_rate",
                "participants", "excluded_clients", "uplink_MB", "downlink_MB", "communicated_MB",
                "compression_seconds", "uplink_compression_rel_error", "sim_time_s", "sim_round_s", "sim_dropped",
                "staleness_mean")


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


def cached(path: str, settings: dict):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        record = json.load(f)
    return record if record.get("settings") == settings else None


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
