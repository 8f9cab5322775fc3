"""Cost of a local step with Muon, SOAP and Sophia, against AdamW, on MiniLM + LoRA and full fine-tuning.

One local step as the federated trainer runs it (``FederatedTrainer._local_steps``): the optimizer's
``before_forward`` hook (Sophia's curvature refresh: an extra forward and sampled-label backward every
``hess_interval`` = 10 steps), forward, backward, ``clip_grad_norm_`` to 1.0, ``step``, ``zero_grad``.

Model: pretrained MiniLM-L6 (``fedhf.demo_data.minilm_path()``), 3 labels, in train mode; (a) LoRA r 16, alpha
32 on query/key/value/dense (peft, SEQ_CLS: the classifier trains too), (b) every weight trainable. Data: real
tweets, batch 16, at most 64 tokens, padded per batch (``DataCollatorWithPadding``), as the trainer does.

Every optimizer trains its own copy of the model, and all run in one process: round r gives batch r to each of
them in turn (the order rotates every round), so drift in machine load hits all alike. The optimizers are built
by ``fedhf.optim.LocalOptimizer(name).build`` with their defaults. The first ``--warmup`` steps are not timed
(SOAP's first step only builds its eigenbases; that one-off cost, paid again at every client round since the
optimizer is rebuilt, is printed as ``step 0``). SOAP refreshes its eigenbases and Sophia its curvature every
10 steps, so the timed steps are counted in periods of 10: each of the 10 positions in a period takes its
median over the periods, and ms/step is the mean of those 10 medians -- a median that still charges each
refresh once per 10 steps. Targets (cost over AdamW): Muon <= 1.10x, SOAP <= 1.5x, Sophia <= 1.25x. The last
line gives, per optimizer, the worse of the LoRA and full ratios: ``step_cost muon=1.07x soap=1.32x ...``.

After timing, one more period per optimizer runs under ``FlopCounterMode`` and the table adds the matmul GFLOP
per step of the model passes and of the optimizer step, and ``flop x``: the matmul work over AdamW's. That is
the ratio on hardware that ran every matmul at one speed (and elementwise work for free), so it tells a slow
implementation from work the algorithm cannot avoid at this batch: for an m x n weight seen by B tokens per
step, Muon's Newton-Schulz costs of the order of ``T * min(m, n) / B`` times the weight's forward+backward
(Jordan, "Muon", 2024, "FLOP overhead"; T = 5 iterations) and SOAP's rotations of the order of ``(m + n) / B``;
here B is ~900 tokens, and an embedding, whose forward is a lookup, has only the optimizer's cost.

Torch uses all the cores available (``--threads`` to change). Run it alone: while another process holds a core,
two-thread steps stall at every OpenMP barrier (here 5-10x slower) and the ratios mean nothing; ``--threads 1``
is the robust choice on a busy machine.

    python benchmarks/optimizer_cost.py [--steps 30 --warmup 10 | --quick] [--setups lora full] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from peft import LoraConfig, TaskType, get_peft_model  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding  # noqa: E402

from fedhf.demo_data import load_tweets, minilm_path, subsample, tokenize_tweets  # noqa: E402
from fedhf.optim import LocalOptimizer, ModelAccess  # noqa: E402

#: What each optimizer is built with (defaults otherwise). Sophia's refresh period is what the targets assume.
OPTIMIZERS = {"adamw": {}, "muon": {}, "soap": {}, "sophia": {"hess_interval": 10}}
PERIOD = 10  # SOAP's precondition_frequency and Sophia's hess_interval: one of each refresh per period
TARGETS = {"muon": 1.10, "soap": 1.5, "sophia": 1.25}
PARTS = ("curvature", "fwd+bwd", "opt.step")


def build_model(path: str, setup: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)
    if setup == "lora":
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["query", "key", "value", "dense"],
                                                 task_type=TaskType.SEQ_CLS))
    return model.train()


def tweet_batches(path: str, count: int) -> list[dict]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    tweets = load_tweets()
    tweets["train"] = subsample(tweets["train"], 16 * count)
    train = tokenize_tweets(tweets, tokenizer, max_length=64)["train"]
    loader = DataLoader(train, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0),
                        collate_fn=DataCollatorWithPadding(tokenizer))
    return [dict(batch) for batch, _ in zip(loader, range(count))]


def model_access(model: torch.nn.Module) -> ModelAccess:
    """What the trainer hands to ``needs_model`` optimizers, without a Trainer (no autocast: float32 on CPU)."""
    return ModelAccess(model, loss=lambda batch: model(**batch).loss,
                       logits=lambda batch: model(**{k: v for k, v in batch.items() if k != "labels"}).logits,
                       batches=lambda: iter(()))


class Client:
    """One optimizer on its own copy of the model, stepping as ``FederatedTrainer._local_steps`` does."""

    def __init__(self, name: str, model: torch.nn.Module) -> None:
        self.model = model
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        spec = LocalOptimizer(name, OPTIMIZERS[name])
        self.optimizer = spec.build(self.params, spec.lr)
        self.optimizer.attach(model_access(model))
        self.step_index = 0
        self.times: list[dict[str, float]] = []  # per step: seconds in each of PARTS

    def step(self, batch: dict, model_flops=None, step_flops=None) -> None:
        """One local step; ``model_flops``/``step_flops`` (FlopCounterMode) count the model passes / the step."""
        start = time.perf_counter()
        with model_flops or contextlib.nullcontext():
            self.optimizer.before_forward(self.step_index, batch)
            curvature = time.perf_counter()
            self.model(**batch).loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params.values(), 1.0)
        backward = time.perf_counter()
        with step_flops or contextlib.nullcontext():
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        end = time.perf_counter()
        self.step_index += 1
        self.times.append({"curvature": curvature - start, "fwd+bwd": backward - curvature, "opt.step": end - backward,
                           "total": end - start})


def per_step(seconds: list[float], period: int = PERIOD) -> float:
    """Mean over the positions of a period of the median over periods: robust to load spikes, yet a refresh
    that happens once per period is charged once per period."""
    periods = len(seconds) // period
    medians = [statistics.median(seconds[j:periods * period:period]) for j in range(period)]
    return sum(medians) / period


def count_gflops(client: Client, batches: list[dict]) -> tuple[float, float]:
    """Matmul GFLOP per step over one period (so each refresh counts once): (model passes, optimizer step).

    FlopCounterMode counts mm/addmm/bmm/convolutions whatever their dtype, not QR or eigh: the optimizer's
    count is a lower bound on its work."""
    model_total = step_total = 0
    for batch in batches:  # fresh counters every step: entering a FlopCounterMode resets its counts
        model_flops, step_flops = FlopCounterMode(display=False), FlopCounterMode(display=False)
        client.step(batch, model_flops, step_flops)
        model_total += model_flops.get_total_flops()
        step_total += step_flops.get_total_flops()
    return model_total / 1e9 / len(batches), step_total / 1e9 / len(batches)


def measure(path: str, setup: str, batches: list[dict], warmup: int) -> dict[str, dict[str, float]]:
    base = build_model(path, setup)
    clients = [Client(name, copy.deepcopy(base)) for name in OPTIMIZERS]
    del base
    for r, batch in enumerate(batches):
        shift = r % len(clients)  # rotate the order, so no optimizer always runs right after the same one
        for client in clients[shift:] + clients[:shift]:
            client.step(batch)
    out = {}
    for name, client in zip(OPTIMIZERS, clients):
        timed = client.times[warmup:]
        out[name] = {part: 1e3 * per_step([t[part] for t in timed]) for part in (*PARTS, "total")}
        out[name]["step 0"] = 1e3 * client.times[0]["total"]
        out[name]["GF model"], out[name]["GF step"] = count_gflops(client, batches[-PERIOD:])
    trainable = sum(p.numel() for p in clients[0].params.values())
    length = statistics.mean(b["input_ids"].shape[1] for b in batches[warmup:])
    print(f"[{setup}] {trainable:,} trainable values, {len(batches) - warmup} timed steps per optimizer "
          f"(after {warmup} warm-up), mean tokens/batch {length:.1f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per optimizer (rounded up to 10s)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (rounded up to 10s)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 warm-up + 10 timed steps")
    parser.add_argument("--setups", nargs="+", choices=("lora", "full"), default=["lora", "full"])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: cores available")
    cli = parser.parse_args()
    if cli.quick:
        cli.steps, cli.warmup = 10, 10
    steps, warmup = (-(-max(1, n) // PERIOD) * PERIOD for n in (cli.steps, cli.warmup))
    torch.set_num_threads(cli.threads)
    path = minilm_path()
    batches = tweet_batches(path, warmup + steps)
    results = {setup: measure(path, setup, batches, warmup) for setup in cli.setups}

    print(f"\nthreads={torch.get_num_threads()} torch {torch.__version__}; ms per local step "
          f"(position-wise median over {steps // PERIOD} periods of {PERIOD}); parts: curvature refresh "
          "(amortised), forward+backward+clip, optimizer step+zero_grad")
    print(f"{'setup':<6}{'optimizer':<10}{'ms/step':>9}{'x AdamW':>9}" + "".join(f"{p:>11}" for p in PARTS)
          + f"{'step 0':>10}{'GF model':>10}{'GF step':>9}{'flop x':>8}")
    worst = {name: 0.0 for name in TARGETS}
    worst_flops = dict(worst)
    for setup, by_name in results.items():
        adamw = by_name["adamw"]
        for name, ms in by_name.items():
            ratio = ms["total"] / adamw["total"]
            flops = (ms["GF model"] + ms["GF step"]) / (adamw["GF model"] + adamw["GF step"])
            if name in worst:
                worst[name], worst_flops[name] = max(worst[name], ratio), max(worst_flops[name], flops)
            print(f"{setup:<6}{name:<10}{ms['total']:9.1f}{ratio:8.2f}x" + "".join(f"{ms[p]:11.1f}" for p in PARTS)
                  + f"{ms['step 0']:10.1f}{ms['GF model']:10.1f}{ms['GF step']:9.1f}{flops:7.2f}x")
    print("GF: matmul GFLOP per step (model passes incl. curvature / optimizer step, QR and eigh not counted); "
          "flop x: matmul work over AdamW's, the cost ratio if every matmul ran at one speed")
    print("targets: " + " ".join(f"{n}<={t:.2f}x ({'met' if worst[n] <= t else 'MISSED'}; flop x {worst_flops[n]:.2f})"
                                 for n, t in TARGETS.items()))
    print("step_cost " + " ".join(f"{name}={ratio:.2f}x" for name, ratio in worst.items()))


if __name__ == "__main__":
    main()
