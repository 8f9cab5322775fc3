"""Peak memory against the number of clients, for a stateful algorithm (SCAFFOLD keeps c_i per client), with
and without a client-state budget; and clients/second with 1 and 2 processes.

Full fine-tuning of a small ResNet (about 25k parameters, so c_i is about 100 KB per client) on the real
digits; each client holds 4 rows and trains 1 local step; S = 100 clients per round and N / S rounds, so
about 63 % of the clients get state. Every configuration runs in a fresh process and reports its peak RSS
(``ru_maxrss``). Target: with a budget, peak RSS at 10,000 clients / peak RSS at 10 clients <= 1.2.
Last line: ``peak_rss_ratio=1.04``.

    python benchmarks/memory.py [--clients 10 100 1000 10000 --budget_mb 16]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def child(num_clients: int, budget_mb: float, out: str, per_round: int) -> None:
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    from fedhf import FederatedConfig, FederatedTrainer
    from fedhf.data.demo import load_digits_images

    torch.manual_seed(0)
    train = load_digits_images()["train"]
    model = ResNetForImageClassification(ResNetConfig(num_channels=1, embedding_size=16, hidden_sizes=[16, 32],
                                                      depths=[1, 1], layer_type="basic", num_labels=10))
    per_round = min(per_round, num_clients)
    parts = [[(4 * i + j) % len(train) for j in range(4)] for i in range(num_clients)]
    args = FederatedConfig(output_dir=out, algorithm="scaffold", num_clients=num_clients, clients_per_round=per_round,
                           num_rounds=max(1, num_clients // per_round), local_steps=1, per_device_train_batch_size=4,
                           client_state_budget_mb=budget_mb if budget_mb > 0 else None, partition_report=False,
                           report_to="none", disable_tqdm=True, use_cpu=True, seed=0)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=train, client_partitions=parts)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    if trainer.is_world_process_zero():
        trained = args.num_rounds * per_round
        print(json.dumps({"clients": num_clients, "budget_mb": budget_mb, "with_state": len(trainer.client_store),
                          "resident_state_mb": trainer.client_store.resident_bytes / 2**20,
                          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "clients_per_second": trained / seconds, "processes": args.world_size}))


def launch(num_clients, budget_mb, per_round, processes=1):
    out = tempfile.mkdtemp(prefix="fedhf-memory-")
    script = [os.path.abspath(__file__), "--child", str(num_clients), str(budget_mb), out, str(per_round)]
    command = [sys.executable, *script] if processes == 1 else [
        shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun", "--standalone",
        "--nproc_per_node", str(processes), *script]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--budget_mb", type=float, default=16.0)
    parser.add_argument("--per_round", type=int, default=100)
    cli = parser.parse_args()
    rows = []
    for budget in (0.0, cli.budget_mb):
        for n in cli.clients:
            rows.append(launch(n, budget, cli.per_round))
            r = rows[-1]
            print(f"clients={r['clients']:>6} budget={'none' if not budget else f'{budget:g}MB':>6} "
                  f"with_state={r['with_state']:>5} resident_state={r['resident_state_mb']:7.1f}MB "
                  f"peak_rss={r['peak_rss_mb']:7.1f}MB clients/s={r['clients_per_second']:6.1f}", flush=True)
    speed = {p: launch(200, cli.budget_mb, 50, processes=p)["clients_per_second"] for p in (1, 2)}
    print(f"clients/s on 200 clients (50 per round): 1 process {speed[1]:.1f}, 2 processes {speed[2]:.1f}")
    budgeted = [r for r in rows if r["budget_mb"] > 0]
    print(f"peak_rss_ratio={budgeted[-1]['peak_rss_mb'] / budgeted[0]['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
