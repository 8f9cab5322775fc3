"""How many LoRA clients of a small Llama fit at once under a fixed memory budget: the memory plan's prediction
(fedhf/trainer/runners/memory_plan.py) beside the measured peak, for ``batched_clients`` C = 1 (the sequential loop), 2, 4, 8, 16.

Model and data as benchmarks/batched_clients.py (a LlamaForCausalLM built from a config, hidden 256, 4 layers, the
MiniLM tokenizer's 30,522-token vocabulary, LoRA r16 on every linear layer, blocks of ``--seq`` tokens of the
bundled tweets), FedAvg with AdamW, one round of C clients, ``--local_steps`` steps of ``--batch`` rows. Each C runs
in a fresh process; its peak is measured from the start of ``train()``: on CPU the resident-set high-water mark
(``VmHWM``, reset through ``/proc/self/clear_refs`` just before ``train()``) minus the resident set at that moment;
on a GPU ``torch.cuda.max_memory_allocated`` minus the allocation before ``train()``. On CPU also the peak of the
tensors the run allocates (``peak_tensor_bytes``, torch's profiler: what the plan counts, without the memory
libraries hold outside torch's tensors). The model is resident before ``train()`` in both, so the plan's
comparable figure is its total without the model row.

Last line: ``fit_under_budget budget=..MB planned=C measured=C`` (the largest C whose plan / measured peak stays
under ``--budget_mb``; the sequential loop is C = 1).

``--gemma all`` (or a comma-separated list of modes): Gemma-3-270M LoRA runs, one fresh process at a time, one per
head mode and curvature estimator (``GEMMA_MODES``: labelled positions in bf16 and fp32, every position's logits,
fed_sophia with the GNB and the empirical-Fisher estimator, FederatedSFTTrainer with trl's fused head, 2 batched
clients, FedPM), each the plan's total against the peak resident set during ``train()`` minus the resident set
before the model was loaded. Last line: ``gemma_plan_over_measured mode=ratio ...``.

    python benchmarks/memory_plan.py [--sizes 1,2,4,8,16 --budget_mb 1024]
    python benchmarks/memory_plan.py --gemma all       (8 runs of 1-5 minutes each on 2 CPU cores)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def child(batched: int, opts) -> dict:
    import torch
    from transformers import AutoTokenizer, default_data_collator

    from batched_clients import build
    from fedhf import FederatedConfig, FederatedTrainer
    from fedhf.data.demo import minilm_path
    from fedhf.runtime.model_memory import peak_tensor_bytes
    from llm import blocks

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    data = blocks(tokenizer, opts.seq, batched * opts.batch * opts.local_steps)
    with tempfile.TemporaryDirectory() as model_dir, tempfile.TemporaryDirectory() as out:
        model = build(model_dir, tokenizer, opts.hidden, opts.layers, device)
        args = FederatedConfig(output_dir=out, num_clients=batched, clients_per_round=batched, num_rounds=1,
                               local_steps=opts.local_steps, partition="iid", algorithm="fedavg",
                               local_optimizer="adamw", learning_rate=1e-3, per_device_train_batch_size=opts.batch,
                               batched_clients=batched, report_to="none", disable_tqdm=True, logging_strategy="no",
                               save_strategy="no", partition_report=False, use_cpu=device == "cpu",
                               bf16=device == "cuda", seed=0)
        trainer = FederatedTrainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
        tensors = None
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            trainer.train()
        else:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # resets VmHWM to the current resident set
            before = _status_kb("VmRSS") * 1024
            tensors = peak_tensor_bytes(trainer.train, os.path.join(out, "trace.json")) / 2**20
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else _status_kb("VmHWM") * 1024
    plan = trainer.memory_plan
    return {"C": batched, "measured_MB": (peak - before) / 2**20, "device": device, "tensors_MB": tensors,
            "planned_MB": (plan.total_bytes - sum(plan.model_bytes.values())) / 2**20,
            "model_MB": sum(plan.model_bytes.values()) / 2**20,
            "rows_MB": {k: v / 2**20 for k, v in plan.rows().items()}}


# ---------------------------------------------------------------- Gemma-3-270M: the plan per head mode and estimator
#: mode -> (base dtype, FederatedConfig overrides, trainer): make demo-llm's settings at a smaller budget.
GEMMA_MODES = {
    "labelled_bf16": ("bfloat16", {}, "fedhf"),
    "labelled_fp32": ("float32", {}, "fedhf"),
    "full_logits": ("bfloat16", {"logits_at_labels_only": False}, "fedhf"),
    "fed_sophia_gnb": ("bfloat16", {"algorithm": "fed_sophia"}, "fedhf"),
    "fed_sophia_fisher": ("bfloat16", {"algorithm": "fed_sophia",
                                       "local_optimizer_kwargs": {"hessian_estimator": "empirical_fisher"}}, "fedhf"),
    "sft_trainer": ("bfloat16", {}, "trl"),
    "batched_clients_2": ("bfloat16", {"algorithm": "fedavg", "batched_clients": 2}, "fedhf"),
    "fedpm": ("bfloat16", {"algorithm": "fedpm"}, "fedhf"),
}


def _gemma_settings(out: str, dtype, overrides: dict) -> dict:
    import torch

    settings = dict(output_dir=out, report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no",
                    seed=0, num_clients=20, clients_per_round=2, num_rounds=1, local_steps=3, use_cpu=True,
                    per_device_train_batch_size=8, per_device_eval_batch_size=8, partition="dirichlet",
                    partition_column="label", partition_report=False, learning_rate=1e-3, algorithm="fadam_gt",
                    eval_every_rounds=0,
                    bf16=dtype == torch.bfloat16)
    return {**settings, **overrides}


def gemma_child(mode: str) -> dict:
    """One Gemma-3-270M LoRA run (r8 on q/v; 400 tweets as instructions of <= 64 tokens, 20 clients, 2 per round, 3
    local steps of 8 rows, then an evaluation of 32 rows and 16 generated answers): the peak resident set during
    ``train()`` (VmHWM after clear_refs, and a 2 ms poller) minus the resident set before the model was loaded."""
    import gc
    import threading

    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fedhf import FederatedConfig, FederatedTrainer
    from fedhf.data import bundled_gemma
    from fedhf.data.demo import TWEET_LABELS, load_tweet_instructions, subsample
    from fedhf.data.sft import SFTCollator, tokenize_sft
    from fedhf.metrics import GenerationEvalCallback

    torch.set_num_threads(1)
    dtype_name, overrides, trainer_kind = GEMMA_MODES[mode]
    dtype = getattr(torch, dtype_name)
    path = bundled_gemma.gemma_3_270m_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    splits = load_tweet_instructions()
    train, held = subsample(splits["train"], 400), subsample(splits["test"], 32)
    prompts = subsample(splits["test"], 16, seed=1)
    callback = GenerationEvalCallback(tokenizer, list(prompts["prompt"]), [TWEET_LABELS[y] for y in prompts["label"]])
    if trainer_kind == "fedhf":
        train, held = (tokenize_sft(rows, tokenizer, max_length=64) for rows in (train, held))
    gc.collect()
    before_model = _status_kb("VmRSS") * 1024
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                             task_type=TaskType.CAUSAL_LM))
    with tempfile.TemporaryDirectory() as out:
        settings = _gemma_settings(out, dtype, overrides)
        if trainer_kind == "trl":  # trl's loss (its fused LM head) on prompt/completion rows
            from fedhf.trainer.sft import FederatedSFTConfig, FederatedSFTTrainer

            args = FederatedSFTConfig(**settings, gradient_checkpointing=False, max_length=64,
                                      completion_only_loss=True)
            trainer = FederatedSFTTrainer(model=model, args=args, train_dataset=train, eval_dataset=held,
                                          processing_class=tokenizer, callbacks=[callback])
        else:
            trainer = FederatedTrainer(model=model, args=FederatedConfig(**settings), train_dataset=train,
                                       eval_dataset=held, data_collator=SFTCollator(tokenizer),
                                       processing_class=tokenizer, callbacks=[callback])
        gc.collect()
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM to the current resident set
        peak, running = [0], [True]

        def poll():  # VmHWM is the kernel's own high-water mark; the poller only guards against a missed reset
            while running[0]:
                peak[0] = max(peak[0], _status_kb("VmRSS") * 1024)
                time.sleep(0.002)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        start = time.time()
        trainer.train()
        running[0] = False
        poller.join()
        peak_bytes = max(peak[0], _status_kb("VmHWM") * 1024)
    plan = trainer.memory_plan
    return {"mode": mode, "measured_MB": (peak_bytes - before_model) / 2**20, "planned_MB": plan.total_bytes / 2**20,
            "train_s": time.time() - start, "rows_MB": {k: v / 2**20 for k, v in plan.rows().items()},
            "notes": plan.notes, "labelled_logits": trainer.labelled_logits}


def _run_child(*flags: str) -> dict:
    """One measurement in a fresh process, so that its peak is its own."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *flags], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def gemma(modes) -> None:
    """The Gemma-3-270M rows, one fresh process at a time; last line ``gemma_plan_over_measured mode=ratio ...``."""
    ratios = {}
    for mode in modes:
        r = _run_child("--gemma_child", mode)
        ratios[mode] = r["planned_MB"] / r["measured_MB"]
        largest = sorted(r["rows_MB"].items(), key=lambda kv: -kv[1])[:4]
        print(f"{mode:<18} planned {r['planned_MB']:7.0f} MB  measured {r['measured_MB']:7.0f} MB  planned/measured "
              f"{ratios[mode]:.2f}  (train() {r['train_s']:.0f} s; "
              + ", ".join(f"{k} {v:.0f}" for k, v in largest) + " MB)"
              + "".join(f"\n    note: {n}" for n in r["notes"]), flush=True)
    print("gemma_plan_over_measured " + " ".join(f"{m}={v:.2f}" for m, v in ratios.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4,8,16")
    parser.add_argument("--budget_mb", type=float, default=1024.0, help="the fixed budget (beyond the model)")
    parser.add_argument("--local_steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--gemma", default="", help="comma-separated Gemma-3-270M modes, or 'all': "
                        + ", ".join(GEMMA_MODES))
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--gemma_child", default="", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.child, opts)))
        return
    if opts.gemma_child:
        print(json.dumps(gemma_child(opts.gemma_child)))
        return
    if opts.gemma:
        gemma(list(GEMMA_MODES) if opts.gemma == "all" else opts.gemma.split(","))
        return
    rows = []
    for size in [int(s) for s in opts.sizes.split(",")]:
        command = [sys.executable, os.path.abspath(__file__), "--child", str(size)] + [
            a for k in ("local_steps", "batch", "seq", "hidden", "layers") for a in (f"--{k}", str(getattr(opts, k)))]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        rows.append(r := json.loads(done.stdout.strip().splitlines()[-1]))
        tensors = "" if r["tensors_MB"] is None else (f"  tensors' peak {r['tensors_MB']:8.1f} MB, /planned "
                                                       f"{r['tensors_MB'] / r['planned_MB']:.2f}")
        print(f"C={r['C']:2d}  planned {r['planned_MB']:8.1f} MB  measured peak {r['measured_MB']:8.1f} MB  "
              f"measured/planned {r['measured_MB'] / r['planned_MB']:.2f}{tensors}  "
              f"(model {r['model_MB']:.1f} MB resident; "
              f"activations {r['rows_MB']['activations']:.1f}, optimizer {r['rows_MB']['optimizer state']:.1f}, "
              f"adapter copies {r['rows_MB']['adapter copies']:.1f} MB)", flush=True)
    planned = max([r["C"] for r in rows if r["planned_MB"] <= opts.budget_mb], default=0)
    measured = max([r["C"] for r in rows if r["measured_MB"] <= opts.budget_mb], default=0)
    print(f"device={rows[0]['device']} seq={opts.seq} batch={opts.batch} local_steps={opts.local_steps} "
          f"hidden={opts.hidden} layers={opts.layers}; the sequential loop (C=1) holds one client at a time")
    print(f"fit_under_budget budget={opts.budget_mb:g}MB planned={planned} measured={measured}")


if __name__ == "__main__":
    main()
