"""Memory per process of a full-weight FedPAC-Muon round, on one process and with the model sharded by FSDP2 over two
(fedhf/runtime/sharded.py), on CPU (gloo).

A Llama-shaped ``LlamaForCausalLM`` built from a config (random weights: memory, not accuracy; by default ~0.5 B
parameters: hidden 1536, MLP 4096, 16 layers, 32,000-token tied vocabulary), every weight trained, FedPAC-Muon
(``routing="hidden_only"``: the embedding on AdamW, as Keller Jordan's Muon), one round of one client, ``--steps``
local steps of ``--rows`` rows of ``--seq`` random tokens (split over the processes). Each process prints the
memory plan fedhf makes for it (its shards under FSDP) and its measured peak.

The measured peak is the process's resident set: the high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs`` when ``train()`` starts) minus the resident set after the imports and the process group,
before the model is built (the libraries' own baseline, ~0.5 GB, is the same with and without FSDP and is left
out). Not counted: the whole model each process builds before FSDP shards it (fedhf shards a model that is already
loaded; loading it on the meta device first is not done here).

Last line: ``fsdp_memory_per_rank_ratio=<2-process peak / 1-process peak>`` (the larger rank's peak).

    nice -n 19 python benchmarks/fsdp_memory.py [--hidden 1536 --intermediate 4096 --layers 16 --vocab 32000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def resident_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(args) -> None:
    """One process of a run: build, train one round, print the plan and the peak as one JSON line."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    torch.set_num_threads(1)
    if args.fsdp:
        torch.distributed.init_process_group("gloo")
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, default_data_collator

    from fedhf import FederatedConfig, FederatedTrainer

    baseline = resident_kb("VmRSS")
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=args.hidden // 64, max_position_embeddings=args.seq,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    ids = torch.randint(1, args.vocab, (args.rows * args.steps, args.seq),
                        generator=torch.Generator().manual_seed(0)).tolist()
    data = Dataset.from_dict({"input_ids": ids, "labels": ids})
    extra = {"fsdp": True} if args.fsdp else {}
    fed = FederatedConfig(output_dir=args.out, report_to="none", disable_tqdm=True, save_strategy="no",
                          logging_strategy="no", use_cpu=True, seed=0, num_clients=1, clients_per_round=1,
                          num_rounds=1, local_steps=args.steps, per_device_train_batch_size=args.rows,
                          algorithm="fedpac_muon", algorithm_kwargs={"routing": "hidden_only"},
                          learning_rate=3e-4, partition="iid", partition_report=False, **extra)
    trainer = FederatedTrainer(model=model, args=fed, train_dataset=data, data_collator=default_data_collator)
    with open("/proc/self/clear_refs", "w") as refs:  # VmHWM from here
        refs.write("5")
    trainer.train()
    peak = resident_kb("VmHWM")
    rank = torch.distributed.get_rank() if args.fsdp else 0
    print(json.dumps({"rank": rank, "processes": fed.world_size, "parameters": parameters,
                      "peak_mb": (peak - baseline) / 1024, "baseline_mb": baseline / 1024,
                      "planned_mb": trainer.memory_plan.total_bytes / 2**20, "plan": str(trainer.memory_plan)}),
          flush=True)


def launch(processes: int, args) -> list:
    out = tempfile.mkdtemp(prefix=f"fsdp_memory_{processes}_")
    script = [os.path.abspath(__file__), "--worker", "--out", out, "--hidden", str(args.hidden),
              "--intermediate", str(args.intermediate), "--layers", str(args.layers), "--vocab", str(args.vocab),
              "--seq", str(args.seq), "--rows", str(args.rows), "--steps", str(args.steps)]
    if processes == 1:
        command = [sys.executable, *script]
    else:
        torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
        command = [torchrun, "--standalone", "--nproc_per_node", str(processes), *script, "--fsdp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                  key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fsdp", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--intermediate", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    runs = {n: launch(n, args) for n in (1, 2)}
    print(f"Llama-shaped model: {runs[1][0]['parameters'] / 1e6:.1f} M parameters (hidden {args.hidden}, MLP "
          f"{args.intermediate}, {args.layers} layers, vocabulary {args.vocab}); FedPAC-Muon, full weights, "
          f"{args.steps} local step(s) of {args.rows} x {args.seq} tokens; CPU, gloo, 1 thread per process")
    for n, ranks in runs.items():
        for r in ranks:
            print(f"\n--- {n} process(es), rank {r['rank']}: the memory plan ---\n{r['plan']}")
            print(f"measured peak (resident set above the {r['baseline_mb']:.0f} MB library baseline): "
                  f"{r['peak_mb']:.0f} MB; planned {r['planned_mb']:.0f} MB")
    one, two = runs[1][0]["peak_mb"], max(r["peak_mb"] for r in runs[2])
    print(f"\npeak_mb_1_process={one:.0f} peak_mb_per_rank_2_processes={two:.0f}")
    print(f"fsdp_memory_per_rank_ratio={two / one:.3f}")


if __name__ == "__main__":
    main()
