"""How many LoRA clients of a small Llama fit at once under a fixed memory budget: the memory plan's prediction
(fedhf/trainer/memory_plan.py) beside the measured peak, for ``batched_clients`` C = 1 (the sequential loop), 2, 4, 8, 16.

Model and data as benchmarks/batched_clients.py (a LlamaForCausalLM built from a config, hidden 256, 4 layers, the
MiniLM tokenizer's 30,522-token vocabulary, LoRA r16 on every linear layer, blocks of ``--seq`` tokens of the
bundled tweets), FedAvg with AdamW, one round of C clients, ``--local_steps`` steps of ``--batch`` rows. Each C runs
in a fresh process; its peak is measured from the start of ``train()``: on CPU the resident-set high-water mark
(``VmHWM``, reset through ``/proc/self/clear_refs`` just before ``train()``) minus the resident set at that moment;
on a GPU ``torch.cuda.max_memory_allocated`` minus the allocation before ``train()``. The model is resident
before ``train()`` in both, so the plan's comparable figure is its total without the model row.

Last line: ``fit_under_budget budget=..MB planned=C measured=C`` (the largest C whose plan / measured peak stays
under ``--budget_mb``; the sequential loop is C = 1).

    python benchmarks/memory_plan.py [--sizes 1,2,4,8,16 --budget_mb 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

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
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # resets VmHWM to the current resident set
            before = _status_kb("VmRSS") * 1024
        trainer.train()
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else _status_kb("VmHWM") * 1024
    plan = trainer.memory_plan
    return {"C": batched, "measured_MB": (peak - before) / 2**20, "device": device,
            "planned_MB": (plan.total_bytes - sum(plan.model_bytes.values())) / 2**20,
            "model_MB": sum(plan.model_bytes.values()) / 2**20,
            "rows_MB": {k: v / 2**20 for k, v in plan.rows().items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4,8,16")
    parser.add_argument("--budget_mb", type=float, default=1024.0, help="the fixed budget (beyond the model)")
    parser.add_argument("--local_steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.child, opts)))
        return
    rows = []
    for size in [int(s) for s in opts.sizes.split(",")]:
        command = [sys.executable, os.path.abspath(__file__), "--child", str(size)] + [
            a for k in ("local_steps", "batch", "seq", "hidden", "layers") for a in (f"--{k}", str(getattr(opts, k)))]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        rows.append(r := json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"C={r['C']:2d}  planned {r['planned_MB']:8.1f} MB  measured peak {r['measured_MB']:8.1f} MB  "
              f"measured/planned {r['measured_MB'] / r['planned_MB']:.2f}  (model {r['model_MB']:.1f} MB resident; "
              f"activations {r['rows_MB']['activations']:.1f}, optimizer {r['rows_MB']['optimizer state']:.1f}, "
              f"adapter copies {r['rows_MB']['adapter copies']:.1f} MB)", flush=True)
    planned = max([r["C"] for r in rows if r["planned_MB"] <= opts.budget_mb], default=0)
    measured = max([r["C"] for r in rows if r["measured_MB"] <= opts.budget_mb], default=0)
    print(f"device={rows[0]['device']} seq={opts.seq} batch={opts.batch} local_steps={opts.local_steps} "
          f"hidden={opts.hidden} layers={opts.layers}; the sequential loop (C=1) holds one client at a time")
    print(f"fit_under_budget budget={opts.budget_mb:g}MB planned={planned} measured={measured}")


if __name__ == "__main__":
    main()
