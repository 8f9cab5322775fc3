"""The model card section that says how a model was trained federatedly (appended to Trainer's card)."""

from __future__ import annotations

from typing import List

from .metrics.history import is_quality_metric

FEDERATED_TAGS = ["fedhf", "federated-learning"]


def federated_card_section(args, algorithm, partition_summary: dict, history: List[dict]) -> str:
    sizes = partition_summary.get("sizes", [])
    lines = [
        "",
        "## Federated training (fedhf)",
        "",
        f"Trained with fedhf `FederatedTrainer`: **{algorithm.name}** "
        f"({algorithm.describe()}).",
        "",
        "| setting | value |",
        "|---|---|",
        f"| clients (N) | {args.num_clients} |",
        f"| clients per round (S) | {args.clients_per_round} |",
        f"| rounds (R) | {args.num_rounds} |",
        f"| local steps per round (K) | {args.local_steps} |",
        f"| local batch size | {args.per_device_train_batch_size} |",
        f"| learning rate schedule over rounds | {args.round_lr_schedule}, peak {algorithm.optimizer.lr} |",
        f"| partition | {args.partition}" + (f" (alpha={args.dirichlet_alpha}, column `{args.partition_column}`)"
                                             if args.partition == "dirichlet" else "") + " |",
    ]
    if sizes:
        lines.append(f"| rows per client (min / max) | {min(sizes)} / {max(sizes)} |")
    if "label_skew" in partition_summary:
        lines.append(f"| label skew (mean TV distance to the global mix) | {partition_summary['label_skew']:.3f} |")
    if history:
        last = history[-1]
        lines.append(f"| communicated (up + down) | {last.get('communicated_MB', 0.0):.1f} MB |")
        evals = {k: v for k, v in last.items() if (is_quality_metric(k) or k == "eval_loss") and isinstance(v, float)}
        for key, value in sorted(evals.items()):
            lines.append(f"| final {key} | {value:.4f} |")
    return "\n".join(lines) + "\n"
