"""The report of benchmarks/llm_comparison.py from whatever runs are stored; a run not stored yet is "pending".

    python benchmarks/llm_comparison_report.py     # -> benchmarks/llm_comparison_result.md, .json, .png

Per algorithm: the lr bracket's validation scores (seed 0) and the chosen lr; at the chosen lr, the test scores
after the last round per seed (log-likelihood accuracy on the scored rows, the greedy answer's accuracy and
unparseable rate, eval loss). While an algorithm's bracket is unfinished its default-lr run (seed 0) is shown
instead, marked so.

Seeds and intervals: each algorithm's mean over its finished seeds with a 95 % t-interval, mean +- t_{0.975, n-1}
s / sqrt(n) (s the sample standard deviation; no interval from one seed), and the paired difference to FedAvg:
the per-seed differences d_s = score(algorithm, seed s) - score(FedAvg, seed s) over the seeds both finished (the
same seed draws the same client split and cohorts, so the pair shares them), their mean with the same t-interval.
A difference is *resolved* when its interval excludes 0. Both for the generative accuracy and, where the runs
recorded it, the log-likelihood accuracy. The best algorithm is the one with the highest mean log-likelihood accuracy.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from scipy import stats

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from llm_comparison import ALGORITHMS, SEEDS, TASK, bracket, chosen_label, load_base, load_run  # noqa: E402

from fedhf.metrics import write_json_atomic  # noqa: E402

OUT = os.path.join(HERE, "llm_comparison_result")
NAMES = {"fedavg": "FedAvg", "local_adamw": "Local AdamW", "scaffold": "SCAFFOLD", "fedpac_muon": "FedPAC-Muon",
         "fedmuon": "FedMuon", "local_muon": "Local Muon", "fadam_gt": "FAdam-GT", "diloco": "DiLoCo",
         "muloco": "MuLoCo", "desloc": "DES-LOC"}
LOGLIK, ACC = "loglik_accuracy", "generation_accuracy"
BASELINE = "fedavg"


def t_interval(values, level: float = 0.95):
    """(mean, half-width) of the t-interval over ``values``; the half-width is NaN below two values."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return (float(values.mean()) if len(values) else float("nan")), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return float(values.mean()), float(half)


def paired_difference(scores: dict, baseline: dict) -> dict:
    """The paired difference to the baseline over the seeds both have ({seed: score} each): its seeds, mean,
    95 % half-width, and whether the interval excludes 0."""
    seeds = sorted(set(scores) & set(baseline))
    mean, half = t_interval([scores[s] - baseline[s] for s in seeds])
    return {"seeds": seeds, "mean": mean, "ci95": half, "resolved": bool(np.isfinite(half) and abs(mean) > half)}


def final_scores(row: dict, key: str) -> dict:
    """{seed: the test score ``key``} of a row's finished seeds."""
    return {seed: record["test"][key] for seed, record in sorted(row["records_by_seed"].items()) if record is not None}


def seed_table(rows: dict) -> list:
    """The markdown lines of the seeds section: each metric's mean +- 95 % interval and paired difference."""
    lines = ["## Seeds: 95 % intervals, and the paired difference to FedAvg (same seeds, same splits)", ""]
    for key, label in ((LOGLIK, "log-likelihood accuracy"), (ACC, "generative accuracy (first word)")):
        base = final_scores(rows[BASELINE], key) if BASELINE in rows else {}
        lines += [f"{label}:", "", "| algorithm | seeds | mean +- 95 % | minus FedAvg, mean +- 95 % | resolved |",
                  "|---|---|---|---|---|"]
        for name, row in rows.items():
            scores = final_scores(row, key)
            if not scores:
                lines.append(f"| {row['name']} | 0 | pending | pending | - |")
                continue
            mean, half = t_interval(list(scores.values()))
            cell = f"{mean:.3f} +- {half:.3f}" if np.isfinite(half) else f"{mean:.3f} (no interval from 1 seed)"
            if name == BASELINE:
                lines.append(f"| {row['name']} | {len(scores)} | {cell} | (baseline) | - |")
                continue
            diff = paired_difference(scores, base)
            if not diff["seeds"]:
                lines.append(f"| {row['name']} | {len(scores)} | {cell} | no common seed | - |")
                continue
            d = (f"{diff['mean']:+.3f} +- {diff['ci95']:.3f}" if np.isfinite(diff["ci95"])
                 else f"{diff['mean']:+.3f} (1 seed)")
            lines.append(f"| {row['name']} | {len(scores)} | {cell} | {d} | {'yes' if diff['resolved'] else 'no'} |")
        lines.append("")
    return lines


def majority_accuracy(rows: int) -> float:
    """The most frequent answer's share of the first ``rows`` scored test rows (llm_comparison.load_data's)."""
    from fedhf.data.demo import load_tweet_instructions

    test = load_tweet_instructions()["test"].shuffle(seed=0)
    labels = test.select(range(TASK["eval_rows"], TASK["eval_rows"] + rows))["label"]
    return float(np.bincount(labels).max() / len(labels))


def interval(values) -> str:
    if not values:
        return "pending"
    mean, half = t_interval(values)
    return f"{mean:.3f} +- {half:.3f}" if np.isfinite(half) else f"{mean:.3f} (1 seed)"


def summarize(name: str) -> dict:
    lrs = bracket(name)
    grid = {lr: load_run(label, 0) for lr, label in lrs.items()}
    grid = {lr: None if r is None else r["validation"] for lr, r in grid.items()}
    chosen = chosen_label(name)
    label, status = (chosen, "chosen") if chosen else (name, "default lr (bracket pending)")
    seeds = {seed: load_run(label, seed) for seed in (SEEDS if chosen else (0,))}
    finished = [r for r in seeds.values() if r is not None]
    chosen_lr = next((lr for lr, lab in lrs.items() if lab == label), None)
    return {"name": NAMES[name], "label": label, "status": status, "lr": chosen_lr, "bracket": grid,
            "records_by_seed": seeds,
            "test": {key: [r["test"][key] for r in finished] for key in
                     (LOGLIK, "loglik_answer_logprob", ACC, "flowertune_accuracy", "generation_unparseable_rate",
                      "eval_loss")},
            "uplink_MB": finished[0]["history"][-1]["uplink_MB"] if finished else None,
            "minutes": [(r["wall_s"] + r["score_s"]) / 60 for r in finished],
            "train_minutes": [r["wall_s"] / 60 for r in finished]}


def best(rows: dict):
    """The algorithm with the highest mean test log-likelihood accuracy among those with every seed, or None."""
    done = {n: r for n, r in rows.items() if r["status"] == "chosen" and len(r["test"][LOGLIK]) == len(SEEDS)}
    return max(done, key=lambda n: np.mean(done[n]["test"][LOGLIK])) if done else None


def pending_cells(rows: dict) -> int:
    """The runs still to come: a chosen lr's missing seeds; for an unfinished bracket its missing runs, then the
    seeds after 0 at the lr it will choose (seed 0 is that lr's bracket run)."""
    return sum(len(SEEDS) - len(r["test"][LOGLIK]) if r["status"] == "chosen"
               else sum(v is None for v in r["bracket"].values()) + len(SEEDS) - 1 for r in rows.values())


def result_line(rows: dict) -> str:
    name = best(rows)
    if name is None or pending_cells(rows):
        return f"gemma_comparison algorithms={len(rows)} pending_runs={pending_cells(rows)}"
    diff = paired_difference(final_scores(rows[name], LOGLIK), final_scores(rows[BASELINE], LOGLIK))
    return (f"gemma_comparison algorithms={len(rows)} seeds={len(SEEDS)} best={rows[name]['name'].replace(' ', '_')} "
            f"best_minus_fedavg={diff['mean']:+.3f} ci95={diff['ci95']:.3f}")


def markdown(rows: dict, base: dict, majority: dict) -> str:
    t = TASK
    base_cell = (f"the base model (every run's start) scores log-likelihood accuracy {base['test'][LOGLIK]:.3f}, "
                 f"first-word accuracy {base['test'][ACC]:.3f} (unparseable {base['test']['generation_unparseable_rate']:.2f}), "
                 f"eval loss {base['test']['eval_loss']:.3f}" if base else "the base model's scores: pending")
    lines = [
        "# Ten algorithms on Gemma-3-270M + LoRA (non-IID tweets as instructions)", "",
        f"Gemma-3-270M, LoRA r{t['lora_r']} on {t['lora_targets']}; {t['train_rows']} training rows, Dirichlet "
        f"{t['dirichlet_alpha']} over the sentiment, {t['num_clients']} clients, {t['clients_per_round']} a round, "
        f"{t['num_rounds']} rounds x {t['local_steps']} local steps x {t['batch_size']} rows, at most "
        f"{t['max_length']} tokens. Scored once after the last round on the test split: log-likelihood accuracy of "
        f"the three answers on {t['loglik_rows']} rows (majority answer {majority['loglik']:.3f}), the greedy answer's "
        f"first word on the first {t['generation_rows']} of them (majority {majority['generation']:.2f}), eval loss on "
        f"{t['eval_rows']} other rows; {base_cell}. lr chosen from x1/3, x1, x3 of each algorithm's default by the "
        f"log-likelihood accuracy on {t['validation_rows']} training-split rows no client holds (seed 0; ties: the "
        f"right answer's mean log-probability); seeds {', '.join(map(str, SEEDS))} at the chosen lr (a seed draws the "
        "LoRA init, the split and the cohorts). The lr is the local optimizer's (for the Muon algorithms its AdamW "
        "lr; Muon's is 100x it); server settings stay at their defaults (DiLoCo outer lr 0.7, momentum 0.9; MuLoCo "
        "0.9, 0.8; DiLoCo and MuLoCo keep each client's inner state). One thread per run, two runs at a time on the "
        "2-core CPU. Rebuild: `python benchmarks/llm_comparison.py` (resumable), then "
        "`python benchmarks/llm_comparison_report.py`.", "",
        "## After the last round (test rows; mean +- 95 % t-interval over seeds)", "",
        "| algorithm | lr | log-likelihood accuracy | right answer's log-prob | first-word accuracy | "
        "unparseable | FlowerTune rule | eval loss | " + " | ".join(f"seed {s} loglik" for s in SEEDS)
        + " | uplink MB | min / run (train + score) |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(SEEDS) + "---|---|"]
    for row in rows.values():
        test, by_seed = row["test"], row["records_by_seed"]
        per_seed = [f"{by_seed[s]['test'][LOGLIK]:.3f}" if by_seed.get(s) else "pending" for s in SEEDS]
        lr = f"{row['lr']:.3g}" + ("" if row["status"] == "chosen" else " (default; bracket pending)")
        mb = f"{row['uplink_MB']:.1f}" if row["uplink_MB"] is not None else "pending"
        minutes = (f"{np.mean(row['minutes']):.1f} ({np.mean(row['train_minutes']):.1f} + "
                   f"{np.mean(row['minutes']) - np.mean(row['train_minutes']):.1f})" if row["minutes"] else "")
        lines.append(f"| {row['name']} | {lr} | " + " | ".join(interval(test[k]) for k in (
            LOGLIK, "loglik_answer_logprob", ACC, "generation_unparseable_rate", "flowertune_accuracy", "eval_loss"))
            + " | " + " | ".join(per_seed) + f" | {mb} | {minutes} |")
    lines += ["", result_line(rows), ""] + seed_table(rows)
    lines += ["## lr bracket (seed 0, validation rows: log-likelihood accuracy / right answer's log-prob)", "",
              "| algorithm | x1/3 | x1 (default) | x3 | chosen |", "|---|---|---|---|---|"]
    for row in rows.values():
        cells = [f"{lr:.3g}: " + (f"{v['loglik_accuracy']:.3f} / {v['loglik_answer_logprob']:.3f}" if v else "pending")
                 for lr, v in sorted(row["bracket"].items())]
        chosen = f"{row['lr']:.3g}" if row["status"] == "chosen" else "pending"
        lines.append(f"| {row['name']} | " + " | ".join(cells) + f" | {chosen} |")
    return "\n".join(lines) + "\n"


def summary_table(rows: dict) -> str:
    """The compact table README.md shows (copied from the result file)."""
    lines = ["| algorithm | lr | log-likelihood accuracy | minus FedAvg (paired) | first-word accuracy | seeds |",
             "|---|---|---|---|---|---|"]
    base = final_scores(rows[BASELINE], LOGLIK)
    for name, row in rows.items():
        diff = paired_difference(final_scores(row, LOGLIK), base)
        d = ("(baseline)" if name == BASELINE else f"{diff['mean']:+.3f} +- {diff['ci95']:.3f}"
             + (" (resolved)" if diff["resolved"] else "") if diff["seeds"] else "pending")
        lines.append(f"| {row['name']} | {row['lr']:.3g} | {interval(row['test'][LOGLIK])} | {d} | "
                     f"{interval(row['test'][ACC])} | {len(row['test'][LOGLIK])} of {len(SEEDS)} |")
    return "\n".join(lines) + "\n"


def plot(rows: dict, base: dict, majority: float, path: str) -> None:
    """Each algorithm's seeds and mean (with its 95 % interval) of the test log-likelihood accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, row in enumerate(rows.values()):
        values = row["test"][LOGLIK]
        if not values:
            continue
        ax.scatter([i] * len(values), values, color="0.6", s=12)
        mean, half = t_interval(values)
        ax.errorbar([i], [mean], yerr=[[half if np.isfinite(half) else 0]], fmt="o", color="C0", capsize=4)
    ax.axhline(majority, color="0.4", ls=":", label=f"majority answer {majority:.2f}")
    if base:
        ax.axhline(base["test"][LOGLIK], color="C3", ls="--", label=f"base model {base['test'][LOGLIK]:.2f}")
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows.values()], rotation=30, ha="right")
    ax.set_ylabel("test log-likelihood accuracy")
    ax.set_title("Gemma-3-270M + LoRA, Dirichlet 0.1: seeds (grey), mean +- 95 %")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    rows = {name: summarize(name) for name in ALGORITHMS}
    base = load_base()
    majority = {"loglik": majority_accuracy(TASK["loglik_rows"]), "generation": majority_accuracy(TASK["generation_rows"])}
    with open(OUT + ".md", "w") as f:
        f.write(markdown(rows, base, majority) + "\n## Summary (the table of README.md)\n\n" + summary_table(rows))
    write_json_atomic({"task": TASK, "majority_accuracy": majority, "base": base and base["test"],
                       "result_line": result_line(rows),
                       "algorithms": {n: {k: v for k, v in r.items() if k != "records_by_seed"} for n, r in rows.items()},
                       "paired_difference_to_fedavg": {
                           key: {n: paired_difference(final_scores(r, key), final_scores(rows[BASELINE], key))
                                 for n, r in rows.items() if n != BASELINE} for key in (LOGLIK, ACC)}},
                      OUT + ".json")
    plot(rows, base, majority["loglik"], OUT + ".png")
    print(open(OUT + ".md").read())


if __name__ == "__main__":
    main()
