"""Tables and plots of federated runs over seeds (benchmarks/algorithms.py, benchmarks/lora_federation.py): a run
is a stored record {"settings", "history" (per-round dicts), "wall_s", "client_sizes", "label_skew",
"majority_accuracy"}; the task's accuracy key and target come from comparison_tasks."""

from __future__ import annotations

import numpy as np

from comparison_tasks import ACCURACY, TARGETS

# "last TAIL evals": each seed's accuracy averaged over its last TAIL evaluations, then over seeds -- under
# Dirichlet 0.1 with 5 of 20 clients a round the global model swings with each round's label mix, so the last
# evaluation alone is partly a draw of that mix.
TAIL = 3


def summarize(records: list, target: float) -> dict:
    """One algorithm's seeds -> the table row (scores over eval rounds; round 0 is the untrained model)."""
    key = ACCURACY[records[0]["settings"]["dataset"]]
    finals, tails, bests, losses, to_target, totals, walls, notes = [], [], [], [], [], [], [], []
    for record in records:
        history = record["history"]
        accs = [h[key] for h in history if key in h]
        finals.append(accs[-1])
        tails.append(float(np.mean(accs[-TAIL:])))
        bests.append(max(accs))
        losses.append(history[-1].get("eval_loss", float("nan")))
        reached = next((h["communicated_MB"] for h in history if h.get(key, 0) >= target and h["round"] > 0), None)
        to_target.append(reached)
        totals.append(history[-1]["communicated_MB"])
        walls.append(record["wall_s"])
        bad_loss = [h["round"] for h in history if "train_loss" in h and not np.isfinite(h["train_loss"])]
        excluded = sum(h.get("excluded_clients", 0) for h in history)
        if bad_loss:
            notes.append(f"seed {record['settings']['seed']}: non-finite train loss in rounds {bad_loss}")
        if excluded:
            notes.append(f"seed {record['settings']['seed']}: {excluded} client updates excluded (non-finite)")
    hits = [m for m in to_target if m is not None]
    spread = (lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0)
    return {"seeds": len(records), "final_mean": float(np.mean(finals)), "final_std": spread(finals),
            "final_min": float(np.min(finals)), "final_max": float(np.max(finals)),
            "tail_mean": float(np.mean(tails)), "tail_std": spread(tails),
            "best_mean": float(np.mean(bests)), "loss_mean": float(np.mean(losses)), "loss_std": spread(losses),
            "mb_to_target_mean": float(np.mean(hits)) if hits else None,
            "reached_target": len(hits), "total_mb": float(np.mean(totals)), "wall_s_mean": float(np.mean(walls)),
            "notes": notes}


def table(dataset: str, summaries: dict, runs: list, tuning: dict = None) -> str:
    """The markdown table of one task; ``tuning`` ({algorithm: summary}) adds the chosen lr and the grid."""
    settings, target = runs[0]["settings"], TARGETS[dataset]
    sizes = [n for r in runs for n in r["client_sizes"]]
    what = "first-word accuracy of greedy answers" if dataset == "llm" else "accuracy"
    lines = [(f"{settings['num_clients']} clients, {settings['clients_per_round']} per round, "
              f"{settings['num_rounds']} rounds x {settings['local_steps']} local steps, batch "
              f"{settings['batch_size']}, Dirichlet alpha {settings['dirichlet_alpha']} (clients hold {min(sizes)}-"
              f"{max(sizes)} rows, label skew {np.mean([r['label_skew'] for r in runs]):.2f}); majority class "
              f"{runs[0]['majority_accuracy']:.3f}; target {what} {target}. Scores on "
              f"{settings.get('eval_rows', 'all')} held-out test rows; ± is the standard deviation over seeds "
              "(ddof 1)."), ""]
    lr_head, lr_rule = ("lr | ", "---|") if tuning else ("", "")
    lines += [(f"| algorithm | {lr_head}final {what} (mean ± std) | min-max | last {TAIL} evals | best | "
               "final eval loss | MB to target (reached) | total MB | wall s / run |"),
              f"|---|{lr_rule}---|---|---|---|---|---|---|---|"]
    for label, s in summaries.items():
        mb = "-" if s["mb_to_target_mean"] is None else f"{s['mb_to_target_mean']:.1f}"
        lr = ""
        if tuning:
            t = tuning[label]
            lr = f"{t['chosen_lr']:.3g}{' (edge)' if t['at_grid_edge'] else ''} | "
        lines.append(f"| {label} | {lr}{s['final_mean']:.3f} ± {s['final_std']:.3f} | {s['final_min']:.3f}-"
                     f"{s['final_max']:.3f} | {s['tail_mean']:.3f} ± {s['tail_std']:.3f} | {s['best_mean']:.3f} | "
                     f"{s['loss_mean']:.3f} ± {s['loss_std']:.3f} | "
                     f"{mb} ({s['reached_target']}/{s['seeds']}) | {s['total_mb']:.1f} | {s['wall_s_mean']:.1f} |")
    notes = [f"- {label}: {note}" for label, s in summaries.items() for note in s["notes"]]
    if tuning:
        key, sense = next(iter(tuning.values()))["score"]
        notes += ["", f"Validation {key} after the last round (seed 0) per grid lr; the chosen one in bold:"]
        for label, t in tuning.items():
            shown = {lr: (v if sense == "max" else -v) if v is not None and np.isfinite(v) else None
                     for lr, v in t["grid"].items()}
            cells = [(f"**{float(lr):.3g}: {v:.3f}**" if float(lr) == t["chosen_lr"] else f"{float(lr):.3g}: "
                      f"{v:.3f}") if v is not None else f"{float(lr):.3g}: failed" for lr, v in shown.items()]
            notes.append(f"- {label}: " + ", ".join(cells))
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def curves(records: list, x_key: str, y_key: str):
    """Mean and min/max of ``y_key`` over seeds at each eval round, against the mean of ``x_key``."""
    rounds = sorted(set.intersection(*[{h["round"] for h in r["history"] if y_key in h} for r in records]))
    y = np.array([[next(h[y_key] for h in r["history"] if h["round"] == t and y_key in h) for t in rounds]
                  for r in records])
    x = np.array([[next(h.get(x_key, 0.0) for h in r["history"] if h["round"] == t and y_key in h)
                   for t in rounds] for r in records]).mean(0)
    return x, y.mean(0), y.min(0), y.max(0)


def plot(dataset: str, by_algorithm: dict, majority: float, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = ACCURACY[dataset]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.2))
    colours = list(plt.get_cmap("tab10").colors) + ["black", "olive", "navy"]
    panels = ((axes[0], "round", key), (axes[1], "communicated_MB", key), (axes[2], "round", "eval_loss"))
    for index, (label, records) in enumerate(by_algorithm.items()):
        colour = colours[index % len(colours)]
        for ax, x_key, y_key in panels:
            x, mean, low, high = curves(records, x_key, y_key)
            if x_key == "communicated_MB":  # a log axis has no 0 MB: it starts at round 1
                x, mean, low, high = x[1:], mean[1:], low[1:], high[1:]
            ax.plot(x, mean, "-", color=colour, label=label, lw=1.6)
            ax.fill_between(x, low, high, color=colour, alpha=0.15, lw=0)
    for ax, xlabel in zip(axes[:2], ("round", "communicated MB, up + down, all clients (log scale; from round 1)")):
        ax.axhline(majority, color="grey", ls=":", lw=1)
        ax.axhline(TARGETS[dataset], color="black", ls="--", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(key.replace("_", " "))
    axes[2].set_xlabel("round")
    axes[2].set_ylabel("eval loss")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].set_xscale("log")
    axes[0].set_title(f"{title}: mean over seeds, band = min-max (dotted: majority class, dashed: target)",
                      fontsize="medium", loc="left")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
