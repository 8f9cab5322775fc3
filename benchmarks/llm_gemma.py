"""A local step on a real pretrained LLM: fedhf against plain ``transformers.Trainer`` and a hand-written loop.

    python benchmarks/llm_gemma.py [--steps 16 --batch 8 --repeats 2]      (also the last part of benchmarks/llm.py)

Model: Gemma-3-270M (bundled-gemma-3-270m; vocabulary 262,144, 62 % of its parameters) with LoRA r8 on q/v, the
base in bfloat16 where the hardware multiplies it (else float32), LoRA in float32. Data: the bundled tweets as
instructions ("Tweet: ...\\nSentiment:" -> " positive"), tokenised with the prompt masked (-100), so a ~40-token
row has 1-3 labelled tokens. Every side trains the same adapter from the same start with SGD (lr 1e-3) on the
same batches in the same order (``--steps`` batches of ``--batch`` rows, padded to their longest row):

* trainer: ``transformers.Trainer`` (its own loop, sequential sampler), timed step by step;
* loop: ``loss = model(**batch).loss; loss.backward(); opt.step(); opt.zero_grad()``;
* fedhf: ``FederatedTrainer``, one client (FedAvg, IID) doing ``--steps`` local steps per round, timed per round
  (sampling, loading the global adapter, the optimizer, the DataLoader, the steps, the update read back, the server
  rule); ``fedhf-full-head``: the same with ``logits_at_labels_only=False`` (the saving's contribution).

Each side is timed ``--repeats`` times (passes or rounds) after one warm-up step, and the fastest is kept against the
noise of a shared machine. Evaluation: ``evaluate()`` of ``--eval_rows`` held-out rows by Trainer and by fedhf.
Last line (tokens/s ratios, one run): ``llm_step_vs_trainer gemma=..x loop=..x`` (fedhf over Trainer, over loop).
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import TrainerCallback  # noqa: E402  (after the offline switch)

LR = 1e-3


def load(opts):
    import torch
    from transformers import AutoTokenizer

    from fedhf.data import bundled_gemma
    from fedhf.data.demo import load_tweet_instructions, subsample
    from fedhf.data.sft import SFTCollator, tokenize_sft
    from fedhf.runtime.hardware import cpu_has_bf16_matmul

    path = bundled_gemma.gemma_3_270m_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    splits = load_tweet_instructions()
    train = tokenize_sft(subsample(splits["train"], opts.steps * opts.batch, seed=0), tokenizer, max_length=64)
    held = tokenize_sft(subsample(splits["test"], opts.eval_rows, seed=0), tokenizer, max_length=64)
    collate = SFTCollator(tokenizer)
    batches = [collate([train[i] for i in range(s * opts.batch, (s + 1) * opts.batch)]) for s in range(opts.steps)]
    native = torch.cuda.is_available() or cpu_has_bf16_matmul()
    return path, train, held, collate, batches, torch.bfloat16 if native else torch.float32


def lora_model(path, dtype):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                            task_type="CAUSAL_LM"))


def time_loop(model, batches, repeats: int) -> float:
    import torch

    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    model.train()
    model(**batches[0]).loss.backward()  # warm-up
    optimizer.zero_grad(set_to_none=True)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return min(times)


class StepClock(TrainerCallback):
    """Each step's time (a round, for fedhf) from its begin to its end."""

    def __init__(self):
        self.times = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.begin)


def time_trainer(model, train, held, collate, steps: int, batch: int, repeats: int, out: str):
    """Trainer on the same batches in order: (seconds for ``steps`` steps, the fastest of ``repeats`` passes
    after the first step, eval seconds)."""
    from torch.utils.data import SequentialSampler
    from transformers import Trainer, TrainingArguments

    class InOrder(Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    clock = StepClock()
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch, per_device_eval_batch_size=16,
                             max_steps=steps * repeats + 1, learning_rate=LR, optim="sgd", lr_scheduler_type="constant",
                             weight_decay=0.0, max_grad_norm=0.0, report_to="none", disable_tqdm=True,
                             logging_strategy="no", save_strategy="no", use_cpu=True, seed=0)
    rows = train.select([i % len(train) for i in range(batch * (steps * repeats + 1))])
    trainer = InOrder(model=model, args=args, train_dataset=rows, eval_dataset=held, data_collator=collate,
                      callbacks=[clock])
    trainer.train()
    passes = [sum(clock.times[1 + r * steps:1 + (r + 1) * steps]) for r in range(repeats)]
    start = time.perf_counter()
    trainer.evaluate()
    return min(passes), time.perf_counter() - start


def time_fedhf(model, train, held, collate, steps: int, batch: int, repeats: int, out: str, labelled: bool):
    from fedhf import FederatedConfig, FederatedTrainer

    clock = StepClock()
    args = FederatedConfig(output_dir=out, num_clients=1, clients_per_round=1, num_rounds=repeats + 1,
                           local_steps=steps, partition="iid", algorithm="fedavg", learning_rate=LR,
                           round_lr_schedule="constant", weight_decay=0.0, max_grad_norm=0.0,
                           per_device_train_batch_size=batch, per_device_eval_batch_size=16, report_to="none",
                           disable_tqdm=True, logging_strategy="no", save_strategy="no", partition_report=False,
                           use_cpu=True, seed=0, logits_at_labels_only=labelled, eval_every_rounds=0,
                           overwrite_output_dir=True)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=train, eval_dataset=held, data_collator=collate,
                               callbacks=[clock])
    trainer.train()
    start = time.perf_counter()
    trainer.evaluate()
    return min(clock.times[1:]), time.perf_counter() - start  # round 1 warms up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eval_rows", type=int, default=64)
    opts = parser.parse_args()
    import torch

    path, train, held, collate, batches, dtype = load(opts)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    seconds, evals = {}, {}
    with tempfile.TemporaryDirectory() as out:
        seconds["loop"] = time_loop(lora_model(path, dtype), batches, opts.repeats)
        seconds["trainer"], evals["trainer"] = time_trainer(lora_model(path, dtype), train, held, collate,
                                                            opts.steps, opts.batch, opts.repeats, out + "/t")
        seconds["fedhf"], evals["fedhf"] = time_fedhf(lora_model(path, dtype), train, held, collate, opts.steps,
                                                      opts.batch, opts.repeats, out + "/f", True)
        seconds["fedhf-full-head"], evals["fedhf-full-head"] = time_fedhf(
            lora_model(path, dtype), train, held, collate, opts.steps, opts.batch, opts.repeats, out + "/g", False)
    for side, s in seconds.items():
        extra = f"  evaluate({opts.eval_rows} rows) {evals[side]:6.2f} s" if side in evals else ""
        print(f"gemma {side:16s} {s:7.2f} s  {tokens / s:8.1f} tokens/s{extra}", flush=True)
    print(f"device=cpu threads={torch.get_num_threads()} python={platform.python_version()} base={dtype} "
          f"steps={opts.steps} batch={opts.batch} tokens={tokens} best of {opts.repeats}")
    print(f"llm_step_vs_trainer gemma={seconds['trainer'] / seconds['fedhf']:.2f}x "
          f"loop={seconds['loop'] / seconds['fedhf']:.2f}x")


if __name__ == "__main__":
    main()
