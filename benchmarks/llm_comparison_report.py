"""The report of benchmarks/llm_comparison.py from whatever runs are stored; a run not stored yet is "pending".

    python benchmarks/llm_comparison_report.py     # -> benchmarks/llm_comparison_result.md, .json, .png

Per algorithm: the lr bracket's validation scores (seed 0) and the chosen lr; at the chosen lr, the test
generation accuracy and eval loss after the last round per seed and as mean +- std (sample std over the finished
seeds; n says how many); and the curves per evaluated round with the uplink MB sent by then. While an algorithm's
bracket is unfinished its default-lr run (seed 0) is shown instead, marked so.

Seeds and intervals: each algorithm's mean over its finished seeds with a 95 % t-interval, mean +- t_{0.975, n-1}
s / sqrt(n) (s the sample standard deviation; no interval from one seed), and the paired difference to FedAvg:
the per-seed differences d_s = score(algorithm, seed s) - score(FedAvg, seed s) over the seeds both finished (the
same seed draws the same client split and cohorts, so the pair shares them), their mean with the same t-interval.
A difference is *resolved* when its interval excludes 0. Both for the generative accuracy and, where the runs
recorded it, the log-likelihood accuracy.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from scipy import stats

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from comparison_report import curves, plot  # noqa: E402
from llm_comparison import ALGORITHMS, SEEDS, TASK, bracket, chosen_label, load_run  # noqa: E402

from fedhf.metrics import write_json_atomic  # noqa: E402

OUT = os.path.join(HERE, "llm_comparison_result")
NAMES = {"fedavg": "FedAvg", "local_adamw": "Local AdamW", "scaffold": "SCAFFOLD", "fedpac_muon": "FedPAC-Muon",
         "fedmuon": "FedMuon", "local_muon": "Local Muon", "fadam_gt": "FAdam-GT", "diloco": "DiLoCo",
         "muloco": "MuLoCo"}
ACC, LOSS = "eval_generation_accuracy", "eval_loss"
LOGLIK = "eval_loglik_accuracy"
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
    """{seed: the final test score ``key``} of a row's finished seeds that recorded it."""
    return {seed: record["history"][-1][key] for seed, record in sorted(row["records_by_seed"].items())
            if record is not None and key in record["history"][-1]}


def seed_table(rows: dict) -> list:
    """The markdown lines of the seeds section: each metric's mean +- 95 % interval and paired difference."""
    lines = ["## Seeds: 95 % intervals, and the paired difference to FedAvg (same seeds, same splits)", ""]
    for key, label in ((ACC, "generative accuracy"), (LOGLIK, "log-likelihood accuracy")):
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


def majority_accuracy() -> float:
    """The most frequent answer's share of the scored test rows (the rows llm_comparison.load_data picks)."""
    from fedhf.data.demo import load_tweet_instructions

    test = load_tweet_instructions()["test"].shuffle(seed=0)
    labels = test.select(range(TASK["eval_rows"], TASK["eval_rows"] + TASK["generation_rows"]))["label"]
    return float(np.bincount(labels).max() / len(labels))


def mean_std(values) -> str:
    if not values:
        return "pending"
    std = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
    return f"{np.mean(values):.3f} +- {std:.3f}" if len(values) > 1 else f"{values[0]:.3f} (1 seed)"


def summarize(name: str) -> dict:
    lrs = bracket(name)
    grid = {}
    for lr, label in lrs.items():
        record = load_run(label, 0)
        grid[lr] = None if record is None else {"label": label, **record["validation"]}
    chosen = chosen_label(name)
    label, status = (chosen, "chosen") if chosen else (name, "default lr (bracket pending)")
    seeds = {seed: load_run(label, seed) for seed in (SEEDS if chosen else (0,))}
    finished = [r for r in seeds.values() if r is not None]
    finals = {seed: None if r is None else {"accuracy": r["history"][-1][ACC], "eval_loss": r["history"][-1][LOSS],
                                            "uplink_MB": r["history"][-1]["uplink_MB"], "wall_s": r["wall_s"]}
              for seed, r in seeds.items()}
    rounds = []
    if finished:
        for key in (ACC, LOSS):
            x, mean, low, high = curves(finished, "uplink_MB", key)
            ticks = sorted({h["round"] for h in finished[0]["history"] if key in h})
            rounds.append({"key": key, "rounds": ticks, "uplink_MB": x.tolist(), "mean": mean.tolist(),
                           "min": low.tolist(), "max": high.tolist()})
    chosen_lr = next((lr for lr, lab in lrs.items() if lab == label), None)
    return {"name": NAMES[name], "label": label, "status": status, "lr": chosen_lr, "bracket": grid,
            "seeds": finals, "curves": rounds, "records": finished, "records_by_seed": seeds,
            "accuracy": mean_std([f["accuracy"] for f in finals.values() if f]),
            "eval_loss": mean_std([f["eval_loss"] for f in finals.values() if f])}


def markdown(rows: dict, majority: float) -> str:
    t = TASK
    lines = [
        "# Nine algorithms on Gemma-3-270M + LoRA (non-IID tweets as instructions)", "",
        f"Gemma-3-270M, LoRA r{t['lora_r']} on {t['lora_targets']}; {t['train_rows']} training rows, Dirichlet "
        f"{t['dirichlet_alpha']} over the sentiment, {t['num_clients']} clients, {t['clients_per_round']} a round, "
        f"{t['num_rounds']} rounds x {t['local_steps']} local steps x {t['batch_size']} rows, at most "
        f"{t['max_length']} tokens. Test: eval loss on {t['eval_rows']} rows, generation accuracy (first word of the "
        f"greedy answer) on {t['generation_rows']} other rows (majority answer {majority:.2f}), every "
        f"{t['eval_every_rounds']} rounds. lr chosen from x1/3, x1, x3 of each algorithm's default by the final "
        f"generation accuracy on {t['validation_rows']} training-split rows no client holds (seed 0); seeds "
        f"{', '.join(map(str, SEEDS))} at the chosen lr. The lr is the local optimizer's (for the Muon algorithms its "
        "AdamW lr; Muon's is 100x it); server settings stay at their defaults (DiLoCo outer lr 0.7, momentum 0.9; "
        "MuLoCo 0.9, 0.8). Rebuild: `python benchmarks/llm_comparison.py` (resumable), "
        "then `python benchmarks/llm_comparison_report.py`.", "",
        "## After the last round (test rows)", "",
        "| algorithm | lr | accuracy, mean +- std | eval loss, mean +- std | "
        + " | ".join(f"seed {s} acc / loss" for s in SEEDS) + " | uplink MB | min / run |",
        "|---|---|---|---|" + "---|" * len(SEEDS) + "---|---|"]
    for row in rows.values():
        per_seed = [f"{f['accuracy']:.3f} / {f['eval_loss']:.3f}" if f else "pending"
                    for f in (row["seeds"].get(s) for s in SEEDS)]
        finished = [f for f in row["seeds"].values() if f]
        mb = f"{finished[0]['uplink_MB']:.1f}" if finished else "pending"
        wall = f"{np.mean([f['wall_s'] for f in finished]) / 60:.1f}" if finished else ""
        lr = f"{row['lr']:.3g}" + ("" if row["status"] == "chosen" else " (default; bracket pending)")
        lines.append(f"| {row['name']} | {lr} | {row['accuracy']} | {row['eval_loss']} | " + " | ".join(per_seed)
                     + f" | {mb} | {wall} |")
    lines += [""] + seed_table(rows)
    lines += ["## Per evaluated round (mean over the finished seeds at the row's lr; uplink MB sent by then)", ""]
    for row in rows.values():
        if not row["curves"]:
            lines.append(f"- {row['name']}: pending")
            continue
        acc, loss = row["curves"]
        cells = [f"r{r} ({mb:.0f} MB): {a:.3f} / {l:.3f}" for r, mb, a, l in
                 zip(acc["rounds"], acc["uplink_MB"], acc["mean"], loss["mean"])]
        lines.append(f"- {row['name']} (accuracy / eval loss): " + "; ".join(cells))
    lines += ["", "## lr bracket (seed 0, validation rows: accuracy / eval loss)", "",
              "| algorithm | x1/3 | x1 (default) | x3 | chosen |", "|---|---|---|---|---|"]
    for row in rows.values():
        cells = [f"{lr:.3g}: " + (f"{v['eval_generation_accuracy']:.3f} / {v['eval_loss']:.3f}" if v else "pending")
                 for lr, v in sorted(row["bracket"].items())]
        chosen = f"{row['lr']:.3g}" if row["status"] == "chosen" else "pending"
        lines.append(f"| {row['name']} | " + " | ".join(cells) + f" | {chosen} |")
    return "\n".join(lines) + "\n"


def summary_table(rows: dict) -> str:
    """The compact table README.md shows (copied from the result file)."""
    lines = ["| algorithm | lr | test accuracy after round 8 | eval loss | seeds done | validation accuracy "
             "(x1/3, x1, x3) |", "|---|---|---|---|---|---|"]
    for row in rows.values():
        done = sum(1 for f in row["seeds"].values() if f)
        chosen = row["status"] == "chosen"
        status = f"{done} of {len(SEEDS)}" if chosen else ("pending" if not done else
                                                            "1 of 3 (seed 0 at the default lr; bracket pending)")
        bracket_cells = ", ".join(f"{v['eval_generation_accuracy']:.2f}" if v else "pending"
                                  for _, v in sorted(row["bracket"].items()))
        lines.append(f"| {row['name']} | {row['lr']:.3g} ({'chosen' if chosen else 'default'}) | {row['accuracy']} "
                     f"| {row['eval_loss']} | {status} | {bracket_cells} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = {name: summarize(name) for name in ALGORITHMS}
    majority = majority_accuracy()
    with open(OUT + ".md", "w") as f:
        f.write(markdown(rows, majority) + "\n## Summary (the table of README.md)\n\n" + summary_table(rows))
    write_json_atomic({"task": TASK, "majority_accuracy": majority,
                       "algorithms": {n: {k: v for k, v in r.items() if k not in ("records", "records_by_seed")}
                                      for n, r in rows.items()},
                       "paired_difference_to_fedavg": {
                           key: {n: paired_difference(final_scores(r, key), final_scores(rows[BASELINE], key))
                                 for n, r in rows.items() if n != BASELINE} for key in (ACC, LOGLIK)}},
                      OUT + ".json")
    plotted = {r["name"]: r["records"] for r in rows.values() if r["records"]}
    if plotted:
        plot("llm", plotted, majority, OUT + ".png", "Gemma-3-270M + LoRA, Dirichlet 0.1")
    print(open(OUT + ".md").read())


if __name__ == "__main__":
    main()
