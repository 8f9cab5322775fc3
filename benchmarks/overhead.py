"""Simulation overhead: a federated run against plain ``transformers.Trainer`` doing the same work.

Same model (pretrained MiniLM-L6 + LoRA r16), same data (real tweets, every batch padded to 64 tokens so every
step costs the same), same batch size, same optimizer (AdamW, lr 1e-3, clip 1.0) and the same number of
optimizer steps: (a) ``Trainer.train()`` with ``max_steps = R * S * K``; (b) ``FederatedTrainer`` with R rounds
of S clients x K local steps (``local_adamw``). The runs alternate (a, b, a, b, ...) and the fastest of each
is kept, so machine noise hits both alike. Target: ratio <= 1.05. Last line: ``overhead_ratio=1.03``.

    python benchmarks/overhead.py [--rounds 4 --clients 3 --local_steps 20 --repeats 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from peft import LoraConfig, TaskType, get_peft_model  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments  # noqa: E402

from fedhf import FederatedConfig, FederatedTrainer  # noqa: E402
from fedhf.data.demo import load_tweets, minilm_path, subsample  # noqa: E402


def build_model(path):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.1, target_modules=["query", "value"],
                                            task_type=TaskType.SEQ_CLS))


def common_args(out):
    return dict(output_dir=out, per_device_train_batch_size=16, learning_rate=1e-3, weight_decay=0.01,
                max_grad_norm=1.0, report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no",
                use_cpu=True, seed=0, dataloader_num_workers=0)


def time_plain(path, data, steps, out):
    trainer = Trainer(model=build_model(path), args=TrainingArguments(max_steps=steps, lr_scheduler_type="constant",
                                                                      **common_args(out)), train_dataset=data)
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start


def time_federated(path, data, rounds, clients, local_steps, out):
    args = FederatedConfig(num_clients=clients, clients_per_round=clients, num_rounds=rounds, local_steps=local_steps,
                           partition="iid", algorithm="local_adamw", round_lr_schedule="constant",
                           partition_report=False, overwrite_output_dir=True, **common_args(out))
    trainer = FederatedTrainer(model=build_model(path), args=args, train_dataset=data)
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--local_steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    cli = parser.parse_args()
    path = minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    data = subsample(load_tweets()["train"], 2000).map(
        lambda b: tokenizer(b["text"], truncation=True, max_length=64, padding="max_length"), batched=True,
        remove_columns=["text"])
    steps = cli.rounds * cli.clients * cli.local_steps
    plain, federated = [], []
    with tempfile.TemporaryDirectory() as out:
        for repeat in range(cli.repeats):
            plain.append(time_plain(path, data, steps, out))
            federated.append(time_federated(path, data, cli.rounds, cli.clients, cli.local_steps, out))
            print(f"repeat {repeat}: plain Trainer {plain[-1]:.1f} s, federated {federated[-1]:.1f} s "
                  f"({steps} optimizer steps each)", flush=True)
    print(f"threads={torch.get_num_threads()} steps={steps} rounds={cli.rounds} clients/round={cli.clients} "
          f"K={cli.local_steps} plain_best={min(plain):.2f}s federated_best={min(federated):.2f}s")
    print(f"overhead_ratio={min(federated) / min(plain):.2f}")


if __name__ == "__main__":
    main()
