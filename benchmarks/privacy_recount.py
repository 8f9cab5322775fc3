"""The true epsilon of the stored utility runs that used adaptive clipping, recomputed from their stored settings.

    python benchmarks/privacy_recount.py

Until the clipped-count bit was centred, adaptive clipping under Poisson sampling sent b_i in {0, 1}: one client
moved the noisy count by 1 (not the 1/2 that Andrew et al.'s noise split assumes), so the pair (sums, count) that
ran was a Gaussian mechanism of z_true = (z_delta^-2 + sigma_b^-2)^-1/2, smaller than the accounted z (z_delta: the
sums' share of z, ``adaptive_noise_split``; sigma_b: the count's noise, the default cohort / 20). This script reads
each run's stored noise multiplier z, recomputes z_true and composes it with the same accountant, sampling and delta
the run used (dp-accounting PLD, Poisson q = cohort / clients, the run's rounds, delta = 1 / clients^1.1), and
writes it beside the run as ``epsilon_true``. The runs are not retrained: the mechanism that ran is known exactly.
Runs with a fixed C (no count) were accounted right and are left alone. New runs need no recount: the bit is now
centred and the accounted z is the mechanism's.

Last line: ``privacy_recount <file>: eps1=<true> eps3=<true> eps8=<true>`` per file (the mean over its runs).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from fedhf.privacy import PrivacyAccountant, adaptive_noise_split  # noqa: E402

FILES = ("privacy_population_result.json", "privacy_population_fadam_gt.json")


def true_noise_multiplier(z: float, count_std: float) -> float:
    """The pair's z when the count's bit moved it by 1: (z_delta^-2 + sigma_b^-2)^-1/2."""
    return (adaptive_noise_split(z, count_std) ** -2 + count_std ** -2) ** -0.5


def recount(path: str) -> dict:
    data = json.load(open(path))
    settings = data["settings"]
    if settings.get("adaptive_quantile") is None:
        return {}
    clients, cohort = settings["clients"], settings["cohort"]
    count_std, delta = cohort / 20.0, 1.0 / clients ** 1.1  # the defaults the runs used (count_std was not settable)
    spent = defaultdict(list)
    for run in data["runs"]:
        if run["epsilon"] is None:
            continue
        z_true = true_noise_multiplier(run["noise_multiplier"], count_std)
        run["epsilon_true"] = PrivacyAccountant(z_true, delta, "poisson", clients, cohort, "pld").epsilon(run["rounds"])
        spent[run["epsilon"]].append(run["epsilon_true"])
    data["recount"] = ("epsilon_true: the epsilon of the mechanism that ran (uncentred count bit), recomputed by "
                       "benchmarks/privacy_recount.py from each run's stored noise multiplier and settings")
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    return {target: sum(values) / len(values) for target, values in sorted(spent.items())}


def main() -> None:
    for name in FILES:
        means = recount(os.path.join(HERE, name))
        print(f"privacy_recount {name}: " + " ".join(f"eps{target:g}={value:.3f}" for target, value in means.items()))


if __name__ == "__main__":
    main()
