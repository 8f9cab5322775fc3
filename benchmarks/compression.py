"""Communication compression measured: accuracy against uplink MB on the tweets classifier (MiniLM-L6 + LoRA r8,
benchmarks/comparison_tasks.py), FedAvg and FedMuon, each at fp32 and every compressor, with and without error
feedback (docs/compression.md).

    python benchmarks/compression.py [--seeds 0 1 2] [--rounds 10] [--algorithms fedavg@learning_rate=0.3 ...]
        [--variants fp32 int8 ...] [--out DIR]

Every run compresses the whole uplink (the LoRA change, the head, and FedMuon's synced momentum) with one spec;
the downlink stays fp32 so the accuracy differences are the uplink's. Per (algorithm, variant): the final
accuracy (mean +- std over seeds), the uplink MB, the ratio to fp32's MB, the compressor's time per round and its
relative error ||C(c) - c|| / ||c||. Runs are stored (benchmarks/algorithm_runs.py) and reused while their
settings match. The last line is

    compression_mb_ratio int8=..x int4=..x topk1=..x acc_drop int8=.. int4=.. topk1=..

for FedAvg (MB reduction over fp32 and accuracy drop in points, same runs, with error feedback).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from algorithm_runs import Runner, cached, run_path, run_settings  # noqa: E402
from comparison_tasks import HERE  # noqa: E402

# (label, spec, error feedback); fp32 is the reference
VARIANTS = [("fp32", "none", True), ("int8", "int8", True), ("int4", "int4", True), ("topk1", "topk:0.01", True),
            ("bf16", "bf16", True), ("int4-noEF", "int4", False), ("int2", "int2", True), ("topk10", "topk:0.1", True),
            ("topk1-noEF", "topk:0.01", False), ("int2-noEF", "int2", False), ("int8-noEF", "int8", False),
            ("powersgd4", "powersgd:4", True)]
# Dirichlet 0.5 (not the comparison's 0.1): at 0.1 and this short budget every variant, fp32 included, predicted
# one class (0.210 accuracy), which compares nothing
BUDGET = dict(train_rows=1000, eval_rows=200, num_clients=20, clients_per_round=5, local_steps=5, batch_size=16,
              dirichlet_alpha=0.5)


def label(algorithm: str, spec: str, feedback: bool) -> str:
    out = algorithm if spec == "none" else f"{algorithm}@uplink_compression={spec}"
    return out if feedback or spec == "none" else out + "@error_feedback=false"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=10)
    # the learning rates the algorithm comparison's validation grid chose on this task (algorithms_result.md)
    parser.add_argument("--algorithms", nargs="+", default=["fedavg@learning_rate=0.3", "fedmuon@learning_rate=9e-05"])
    parser.add_argument("--variants", nargs="+", default=[v[0] for v in VARIANTS])
    parser.add_argument("--out", default=os.path.join(HERE, "compression_runs"))
    parser.add_argument("--report-only", action="store_true", help="report the stored runs; train nothing")
    parser.add_argument("--timing", action="store_true", help="only time each compressor on one large matrix")
    args = parser.parse_args()
    if args.timing:
        print(timing())
        return
    budgets = {"compression": {"tweets": dict(BUDGET, num_rounds=args.rounds, eval_every_rounds=args.rounds)}}
    runner, start = Runner(args.out), time.perf_counter()
    variants = [v for v in VARIANTS if v[0] in args.variants]
    results = {}
    for seed in args.seeds:  # seed-major: a cut-short run still has every variant at the first seeds
        for algorithm in args.algorithms:
            for name, spec, feedback in variants:
                settings = run_settings("tweets", label(algorithm, spec, feedback), seed, "compression",
                                        budgets=budgets)
                record = cached(run_path(args.out, settings), settings) if args.report_only else runner(settings)
                if record is not None:
                    results.setdefault((algorithm, name), []).append(record)
    print(report(results, args, time.perf_counter() - start))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return f"{names[0]}, {os.cpu_count()} cores" if names else platform.machine()
    except OSError:
        return platform.machine()


def timing(shape=(2048, 2048), repeats: int = 3) -> str:
    """Encode + decode seconds of each compressor on one float64 matrix (a 7B model's layer is 4096 x 4096: x4),
    best of ``repeats``, on this machine's CPU (and its GPU when there is one)."""
    import torch

    from fedhf.compression import build_compressor

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    lines = [f"compressor time, encode + decode of a {shape[0]} x {shape[1]} matrix, best of {repeats}; "
             f"torch threads {torch.get_num_threads()}, {cpu_name()} (shared with other work)",
             "| compressor | " + " | ".join(f"{d} s" for d in devices) + " | bytes | ratio vs fp32 |",
             "|---|" + "---|" * (len(devices) + 2)]
    for spec in ("bf16", "int8", "int4", "int2", "topk:0.01", "topk:0.1", "powersgd:4"):
        cells, nbytes = [], 0
        for device in devices:
            x = torch.randn(shape, dtype=torch.float64, device=device)
            generator = torch.Generator(device=device).manual_seed(0)
            compressor, best = build_compressor(spec), float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                encoded = compressor.encode(x, generator)
                compressor.decode(encoded)
                if device == "cuda":
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - start)
            cells.append(f"{best:.3f}")
            nbytes = encoded.nbytes
        lines.append(f"| {spec} | " + " | ".join(cells) + f" | {nbytes:,} | {4 * x.numel() / nbytes:.1f}x |")
    text = "\n".join(lines)
    with open(os.path.join(HERE, "compression_timing.txt"), "w") as f:
        f.write(text + "\n")
    return text


def summary(records: list) -> dict:
    last = [r["history"][-1] for r in records]
    seconds = [np.mean([h.get("compression_seconds", 0.0) for h in r["history"][1:]]) for r in records]
    errors = [np.mean([h["uplink_compression_rel_error"] for h in r["history"] if "uplink_compression_rel_error" in h])
              for r in records if any("uplink_compression_rel_error" in h for h in r["history"])]
    accuracy, loss = [h["eval_accuracy"] for h in last], [h["eval_loss"] for h in last]
    return {"accuracy": float(np.mean(accuracy)), "accuracy_std": float(np.std(accuracy)), "seeds": len(records),
            "eval_loss": float(np.mean(loss)), "eval_loss_std": float(np.std(loss)),
            "uplink_MB": float(np.mean([h["uplink_MB"] for h in last])),
            "compress_s_per_round": float(np.mean(seconds)),
            "rel_error": float(np.mean(errors)) if errors else 0.0,
            "wall_s": float(np.mean([r["wall_s"] for r in records]))}


def paired(records: list, base: list, key: str) -> float:
    """Mean over the seeds both have of (fp32's final ``key`` - this variant's): the drop, same seeds, same splits."""
    final = {r["settings"]["seed"]: r["history"][-1][key] for r in records}
    reference = {r["settings"]["seed"]: r["history"][-1][key] for r in base}
    shared = sorted(set(final) & set(reference))
    return float(np.mean([reference[s] - final[s] for s in shared])) if shared else float("nan")


def report(results: dict, args, wall: float) -> str:
    rows = {key: summary(records) for key, records in results.items()}
    lines = [f"# Compression on tweets (MiniLM-L6 + LoRA r8), {args.rounds} rounds x {BUDGET['local_steps']} local "
             f"steps, 5 of 20 clients, Dirichlet {BUDGET['dirichlet_alpha']}, {BUDGET['train_rows']} training rows, "
             f"{BUDGET['eval_rows']} test rows",
             f"machine: {cpu_name()} (shared with other work), 1 torch thread; uplink compressed, downlink fp32; "
             f"wall of this invocation {wall / 60:.1f} min", "",
             "| algorithm | variant | seeds | accuracy | acc. drop vs fp32 (same seeds) | eval loss | loss rise | "
             "uplink MB | MB ratio vs fp32 | compress s/round | rel. error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    drops = {}
    for (algorithm, name), row in rows.items():
        base, base_records = rows.get((algorithm, "fp32")), results.get((algorithm, "fp32"), [])
        ratio = base["uplink_MB"] / row["uplink_MB"] if base else float("nan")
        drops[algorithm, name] = paired(results[algorithm, name], base_records, "eval_accuracy")
        rise = -paired(results[algorithm, name], base_records, "eval_loss")
        lines.append(f"| {algorithm} | {name} | {row['seeds']} | {row['accuracy']:.3f} +- {row['accuracy_std']:.3f} | "
                     f"{drops[algorithm, name]:+.3f} | {row['eval_loss']:.3f} +- {row['eval_loss_std']:.3f} | "
                     f"{rise:+.3f} | {row['uplink_MB']:.2f} | {ratio:.1f}x | {row['compress_s_per_round']:.3f} | "
                     f"{row['rel_error']:.3f} |")
    with open(os.path.join(HERE, "compression_result.json"), "w") as f:
        json.dump({f"{a}/{n}": {**r, "accuracy_drop_same_seeds": drops[a, n]} for (a, n), r in rows.items()}, f,
                  indent=1)
    fedavg = next((a for a, _ in rows if a.startswith("fedavg")), None)
    base = rows.get((fedavg, "fp32"))
    tail, tail_drops = ["compression_mb_ratio"], ["acc_drop"]
    for name in ("int8", "int4", "topk1"):
        row = rows.get((fedavg, name))
        if base and row:
            tail.append(f"{name}={base['uplink_MB'] / row['uplink_MB']:.1f}x")
            tail_drops.append(f"{name}={drops[fedavg, name]:+.3f}")
    lines += ["", " ".join(tail + tail_drops)]
    text = "\n".join(lines)
    with open(os.path.join(HERE, "compression_result.md"), "w") as f:
        f.write(text + "\n")
    return text


if __name__ == "__main__":
    main()
