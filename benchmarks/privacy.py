"""Utility against epsilon for client-level DP on the tweets classifier, and the per-round cost of DP and secure
aggregation.

    python benchmarks/privacy.py [--seeds 0 1 2] [--algorithms fedavg ffa fedsvd fadam_gt] [--rounds 10] [--costs]

Task: pretrained MiniLM-L6 + LoRA r8 (query, value; the classifier head trained) on the bundled tweets (3 classes),
a simulated population of ``--clients`` clients (Dirichlet alpha 1.0 over the labels, ~13 rows each), Poisson client
sampling with an expected cohort of ``--cohort``, central DP with the noise calibrated (dp-accounting PLD) to
epsilon in {1, 3, 8} at delta = 1 / N^1.1 for the planned rounds, a fixed clip C (``--clip``), and no DP. Algorithms:
FedAvg-LoRA, FFA-LoRA (LoRA A frozen at its init: Sun et al., ICLR 2024), FedSVD (B averaged, A re-factorised on the
server: the noise never touches that post-processing), and FAdam-GT (a second-order seed algorithm whose tracking
state goes through the clip and the noise with the update). Accuracy of the final global model on held-out tweets.

Results are appended to benchmarks/privacy_result.json as they finish (a rerun skips what is there). The last
line printed is ``dp_utility eps1=.. eps3=.. eps8=.. nodp=..``: FedAvg-LoRA's mean accuracy over the seeds done.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

RESULT = os.path.join(HERE, "privacy_result.json")
EPSILONS = [1.0, 3.0, 8.0, None]
ALGORITHMS = {
    "fedavg": dict(algorithm="fedavg"),
    "ffa": dict(algorithm="fedavg", parameter_sharing="ffa"),
    "fedsvd": dict(algorithm="fedavg", server_rule="fedsvd"),
    "fadam_gt": dict(algorithm="fadam_gt"),
}
#: What may differ between invocations that add runs to one results file (the runs are keyed by them).
PER_INVOCATION = ("work", "seeds", "algorithms", "epsilons", "threads", "costs", "result")
SGD_CLIENTS = ("fedavg", "ffa", "fedsvd")  # --lr replaces their local SGD lr (FAdam-GT keeps its Adam default)


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores (shared), torch {torch.__version__}, {platform.python_version()}"


def load(train_rows: int, eval_rows: int):
    from transformers import AutoTokenizer, DataCollatorWithPadding

    from fedhf.data.demo import load_tweets, minilm_path, subsample, tokenize_tweets

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    splits = load_tweets()
    splits["train"] = subsample(splits["train"], train_rows, seed=0)
    splits["test"] = subsample(splits["test"], eval_rows, seed=0)
    return tokenize_tweets(splits, tokenizer, max_length=32), DataCollatorWithPadding(tokenizer)


def model(seed: int):
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification

    from fedhf.data.demo import minilm_path

    torch.manual_seed(seed)
    base = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=3)
    return get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"],
                                           task_type=TaskType.SEQ_CLS))


def run(opts, data, collator, algorithm: str, epsilon, seed: int, privacy=None, rounds=None, out="run") -> dict:
    from fedhf import FederatedConfig, FederatedTrainer
    from fedhf.metrics import accuracy_metrics

    if privacy is None:
        privacy = {} if epsilon is None else dict(dp_mode="central", dp_clip_norm=opts.clip, dp_epsilon=epsilon,
                                                  dp_accountant="pld",
                                                  dp_adaptive_clip_quantile=opts.adaptive_quantile)
    sampling = privacy.pop("client_sampling", "poisson")
    lr = {"learning_rate": opts.lr} if opts.lr is not None and algorithm in SGD_CLIENTS else {}
    args = FederatedConfig(
        output_dir=os.path.join(opts.work, out), overwrite_output_dir=True, report_to="none", disable_tqdm=True,
        logging_strategy="no", save_strategy="no", partition_report=False, use_cpu=True, seed=seed,
        num_clients=opts.clients, clients_per_round=opts.cohort, client_sampling=sampling,
        num_rounds=rounds or opts.rounds, local_steps=opts.local_steps, per_device_train_batch_size=opts.batch_size,
        per_device_eval_batch_size=128, eval_every_rounds=0, dirichlet_alpha=opts.alpha, round_lr_schedule="constant",
        bf16=opts.bf16, **ALGORITHMS[algorithm], **lr, **privacy)
    trainer = FederatedTrainer(model=model(seed), args=args, train_dataset=data["train"], eval_dataset=data["test"],
                               data_collator=collator, compute_metrics=accuracy_metrics)
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    history = trainer.federated_history
    last = history[-1]
    return {"algorithm": algorithm, "epsilon": epsilon, "seed": seed, "accuracy": last.get("eval_accuracy"),
            "epsilon_spent": last.get("dp_epsilon"), "noise_multiplier": last.get("dp_noise_multiplier"),
            "clip_norms": [h.get("dp_clip_norm") for h in history],
            "rounds": last["round"], "participants": [h["participants"] for h in history],
            "uplink_MB": last["uplink_MB"], "seconds": seconds}


def costs(opts, data, collator) -> list:
    """Per-round wall time and uplink per participating client, FedAvg-LoRA, fixed sampling of the cohort."""
    variants = {
        "no DP": dict(client_sampling="fixed"),
        "central DP": dict(client_sampling="fixed", dp_mode="central", dp_clip_norm=opts.clip, dp_noise_multiplier=1.0),
        "central DP + SecAgg": dict(client_sampling="fixed", dp_mode="central", dp_clip_norm=opts.clip,
                                    dp_noise_multiplier=1.0, secure_aggregation=True),
        "distributed DP + SecAgg": dict(client_sampling="fixed", dp_mode="distributed", dp_clip_norm=opts.clip,
                                        dp_noise_multiplier=1.0, secure_aggregation=True),
    }
    rows = []
    for name, privacy in variants.items():
        r = run(opts, data, collator, "fedavg", None, 0, privacy=dict(privacy), rounds=3, out="cost")
        per_client = r["uplink_MB"] * 2 ** 20 / sum(r["participants"])
        rows.append({"variant": name, "seconds_per_round": r["seconds"] / r["rounds"],
                     "uplink_bytes_per_client": per_client})
        print(f"cost {name}: {r['seconds'] / r['rounds']:.2f} s/round, {per_client / 1024:.1f} KiB up per client",
              flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--cohort", type=int, default=10)
    parser.add_argument("--alpha", type=float, default=1.0, help="Dirichlet alpha of the label split")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--clip", type=float, default=0.1)
    parser.add_argument("--adaptive-quantile", type=float, default=None,
                        help="adaptive clipping's target quantile (Andrew et al.); --clip is then the initial C")
    parser.add_argument("--lr", type=float, default=None, help="local SGD lr of fedavg/ffa/fedsvd (default: theirs)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (where the CPU multiplies bf16)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--train-rows", type=int, default=4000)
    parser.add_argument("--eval-rows", type=int, default=300)
    parser.add_argument("--costs", action="store_true", help="also measure the per-round cost of DP and SecAgg")
    parser.add_argument("--work", default="/tmp/fedhf_privacy_benchmark")
    parser.add_argument("--result", default=RESULT, help="the results file (another one for another budget)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=None, help="a subset of 1 3 8 (0 = no DP)")
    opts = parser.parse_args()
    if opts.lr is not None and set(opts.algorithms) - set(SGD_CLIENTS):
        parser.error(f"--lr sets the local SGD lr of {', '.join(SGD_CLIENTS)} only; run "
                     f"{sorted(set(opts.algorithms) - set(SGD_CLIENTS))} without it (their defaults) or on their own.")
    epsilons = EPSILONS if opts.epsilons is None else [e or None for e in opts.epsilons]
    torch.set_num_threads(opts.threads)
    data, collator = load(opts.train_rows, opts.eval_rows)
    done = json.load(open(opts.result)) if os.path.exists(opts.result) else {"runs": [], "costs": []}
    settings = {k: v for k, v in vars(opts).items() if k not in PER_INVOCATION}
    stored = {k: v for k, v in done.get("settings", {}).items() if k not in PER_INVOCATION}
    if done["runs"] and stored != settings:  # a rerun skips finished runs: only those of the same budget
        changed = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
        parser.error(f"{opts.result} holds runs of other settings ({', '.join(changed)}): pass another --result.")
    done["machine"], done["settings"] = machine(), settings
    if opts.costs and not done["costs"]:
        done["costs"] = costs(opts, data, collator)
        json.dump(done, open(opts.result, "w"), indent=1)
    for seed in opts.seeds:
        for algorithm in opts.algorithms:
            for epsilon in epsilons:
                if any(r["algorithm"] == algorithm and r["epsilon"] == epsilon and r["seed"] == seed
                       for r in done["runs"]):
                    continue
                result = run(opts, data, collator, algorithm, epsilon, seed)
                done["runs"].append(result)
                json.dump(done, open(opts.result, "w"), indent=1)
                print(f"{algorithm} eps={epsilon} seed={seed}: accuracy {result['accuracy']:.3f} "
                      f"(sigma {result['noise_multiplier']}, spent {result['epsilon_spent']}, "
                      f"{result['seconds']:.0f} s)", flush=True)
    means = {}
    for epsilon in EPSILONS:
        accs = [r["accuracy"] for r in done["runs"] if r["algorithm"] == "fedavg" and r["epsilon"] == epsilon]
        means[epsilon] = float(np.mean(accs)) if accs else float("nan")
    print(f"dp_utility eps1={means[1.0]:.3f} eps3={means[3.0]:.3f} eps8={means[8.0]:.3f} nodp={means[None]:.3f}")


if __name__ == "__main__":
    main()
