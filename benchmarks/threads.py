"""torch's thread count on a shared CPU: one MiniLM-LoRA local step (the demo's model, batch 16 x 64 tokens) with
1 thread and with one per core, while another process keeps one core busy, as on a machine where something else
runs. The two settings alternate (1, N, 1, N, ...) and each keeps its median step, so machine noise hits both
alike. Last line: ``threads_slowdown=<median step with N threads / median step with 1 thread>``.

    python benchmarks/threads.py [--steps 8 --repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: E402

from fedhf.data.demo import load_tweets, minilm_path  # noqa: E402


def busy(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def step_seconds(model, batch, threads: int, steps: int) -> list:
    torch.set_num_threads(threads)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    rows = load_tweets()["train"].select(range(16))
    batch = tokenizer(list(rows["text"]), padding="max_length", truncation=True, max_length=64, return_tensors="pt")
    batch["labels"] = torch.tensor(list(rows["label"]))
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=3),
                           LoraConfig(r=16, lora_alpha=32, target_modules=["query", "value"], task_type="SEQ_CLS"))
    step_seconds(model, batch, 1, 2)  # warm-up
    hog = multiprocessing.Process(target=busy, args=(3600.0,), daemon=True)
    hog.start()
    try:
        times = {1: [], cores: []}
        for _ in range(opts.repeats):
            for threads in times:
                times[threads] += step_seconds(model, batch, threads, opts.steps)
    finally:
        hog.terminate()
    load = os.getloadavg()[0]
    median = {threads: statistics.median(t) for threads, t in times.items()}
    for threads, seconds in median.items():
        print(f"threads={threads} median_step_s={seconds:.3f} (one other process busy; load average {load:.1f}, "
              f"{cores} cores)")
    print(f"threads_slowdown={median[cores] / median[1]:.2f}")


if __name__ == "__main__":
    main()
