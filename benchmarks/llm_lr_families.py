"""A starting learning rate for every local-optimizer family on a real LLM, each checked by a short run that learns.

    python benchmarks/llm_lr_families.py [--families soap,sophia,...]      (resumable: one stored run per family)

Each family trains Gemma-3-270M + LoRA at ``make demo-llm``'s settings (the Makefile's ``DEMO_LLM_FLAGS``, read from
it: 8 rounds x 5 local steps x 8 rows, 4 of 20 clients, Dirichlet 0.5 over the bundled tweets' sentiment) with the
family's algorithm and starting lr from docs/llm.md, one seed. A family "learns" when its final generation accuracy
on the held-out prompts is above round 0's (zero-shot) and its eval loss below round 0's. Printed per family: the
zero-shot and final generation accuracy, log-likelihood accuracy and eval loss, and the run's wall time on this
machine; the result goes to benchmarks/llm_lr_families_result.md with the machine named.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(ROOT, "benchmarks", "llm_lr_families_runs")
# family -> (algorithm, starting lr): docs/llm.md's table
FAMILIES = {
    "adam": ("fadam_gt", 1e-3),
    "muon": ("fedpac_muon", 3e-4),
    "soap": ("local_soap", 3e-3),
    "sophia": ("local_sophia", 3e-4),
    "foof": ("fedpm", 0.3),
    "sgd": ("fedavg", 0.1),
}


def demo_llm_flags() -> list:
    """The Makefile's DEMO_LLM_FLAGS (one source for the demo and this check), without the algorithm and lr."""
    text = open(os.path.join(ROOT, "Makefile")).read()
    block = re.search(r"DEMO_LLM_FLAGS \?=(.*?)\n(?!\t)", text, re.S).group(1).replace("\\\n", " ")
    flags = shlex.split(block)
    for name in ("--algorithm", "--learning_rate"):
        i = flags.index(name)
        del flags[i:i + 2]
    return flags


def run_family(family: str) -> dict:
    path = os.path.join(RUNS, f"{family}.json")
    if os.path.exists(path):
        return json.load(open(path))
    algorithm, lr = FAMILIES[family]
    out = os.path.join(ROOT, "outputs", "llm_lr_families", family)
    command = [sys.executable, os.path.join(ROOT, "examples", "sft_llm.py"), "--model_name_or_path",
               "bundled-gemma-3-270m", "--dataset", "bundled-tweets-instructions", *demo_llm_flags(),
               "--algorithm", algorithm, "--learning_rate", str(lr), "--output_dir", out, "--overwrite_output_dir"]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    history = [h for h in json.load(open(os.path.join(out, "federated_history.json"))) if "eval_loss" in h]
    first, last = history[0], history[-1]
    result = {"family": family, "algorithm": algorithm, "lr": lr, "seconds": round(seconds, 1),
              "rounds": last["round"], **{f"{key}_{when}": h.get(f"eval_{key}") for when, h in (("start", first),
              ("end", last)) for key in ("generation_accuracy", "loglik_accuracy", "loss")}}
    result["learns"] = (result["generation_accuracy_end"] > result["generation_accuracy_start"]
                        and result["loss_end"] < result["loss_start"])
    os.makedirs(RUNS, exist_ok=True)
    json.dump(result, open(path, "w"), indent=1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    families = parser.parse_args().families.split(",")
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    rows = ["| family | algorithm | lr | generation acc. round 0 -> end | log-lik. acc. | eval loss | learns | minutes |",
            "|---|---|---|---|---|---|---|---|"]
    for family in families:
        r = run_family(family)
        print(json.dumps(r), flush=True)
        rows.append(f"| {family} | `{r['algorithm']}` | {r['lr']:g} | {r['generation_accuracy_start']:.3f} -> "
                    f"{r['generation_accuracy_end']:.3f} | {r['loglik_accuracy_start']:.3f} -> "
                    f"{r['loglik_accuracy_end']:.3f} | {r['loss_start']:.3f} -> {r['loss_end']:.3f} | "
                    f"{'yes' if r['learns'] else 'no'} | {r['seconds'] / 60:.1f} |")
    with open(os.path.join(ROOT, "benchmarks", "llm_lr_families_result.md"), "w") as f:
        f.write(f"# Starting lr per optimizer family on Gemma-3-270M + LoRA (make demo-llm's settings, one seed)\n\n"
                f"Machine: {machine} (times include model loading; shared with other jobs unless stated).\n\n"
                + "\n".join(rows) + "\n")
    print("llm_lr_families " + " ".join(f"{f}={'learns' if run_family(f)['learns'] else 'no'}" for f in families))


if __name__ == "__main__":
    main()
