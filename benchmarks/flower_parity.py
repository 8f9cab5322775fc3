"""Deployment parity and cost: fedhf's tiny reference run (examples/flower_app/) through a real Flower deployment on
loopback (a flower-superlink, ``--nodes`` flower-supernode processes, ``flwr run``) against the same run simulated
in one process, for FedAvg, SCAFFOLD and FedMuon.

Prints ``flower_parity nodes=<n> fedavg=<d> scaffold=<d> fedmuon=<d> round_overhead=<r>``: d is the largest absolute
difference between the two final global models' trainable tensors; r is the deployed run's mean round time over
the simulation's (each from its own ``round_runtime`` history entries, same machine; a deployed round includes
Flower's per-message ClientApp process start and each node's ``make_trainer``).

    PYTHONPATH=. python benchmarks/flower_parity.py --nodes 2 | tee benchmarks/flower_parity_result.txt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.flower.test_parity import deploy, max_difference, simulate  # noqa: E402

ALGORITHMS = ("fedavg", "scaffold", "fedmuon")


def mean_round_seconds(output_dir: str) -> float:
    with open(os.path.join(output_dir, "federated_history.json")) as f:
        history = json.load(f)
    entries = history if isinstance(history, list) else history.get("rounds", history.get("history", []))
    seconds = [e["round_runtime"] for e in entries if "round_runtime" in e]
    return sum(seconds) / len(seconds)


def node_partitions(nodes: int, clients: int = 4):
    return [list(range(clients))[i::nodes] for i in range(nodes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--machine", default="2-core CPU, shared with other jobs")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="fedhf-flower-parity-")
    start = time.time()
    deployed = deploy(folder, ALGORITHMS, node_partitions(args.nodes), timeout=900.0)
    deploy_seconds = time.time() - start
    differences, ratios = {}, []
    for algorithm in ALGORITHMS:
        simulated_dir = os.path.join(folder, f"simulated-{algorithm}")
        simulated = simulate(algorithm, simulated_dir)
        differences[algorithm] = max_difference(deployed[algorithm], simulated)
        ratios.append(mean_round_seconds(os.path.join(folder, f"flower-{algorithm}", "server"))
                      / mean_round_seconds(os.path.join(simulated_dir, "server")))
    print(f"machine: {args.machine}; tiny reference run (1-layer Llama, LoRA r4), 4 clients, 3 per round, "
          f"2 rounds x 2 local steps; {args.nodes} supernodes holding {node_partitions(args.nodes)}; "
          f"the deployment's {len(ALGORITHMS)} runs took {deploy_seconds:.0f} s in all")
    print(f"flower_parity nodes={args.nodes} " + " ".join(f"{a}={differences[a]:.3g}" for a in ALGORITHMS)
          + f" round_overhead={sum(ratios) / len(ratios):.1f}")


if __name__ == "__main__":
    main()
