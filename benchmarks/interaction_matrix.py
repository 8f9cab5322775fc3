"""The interaction matrix (fedhf/interactions/): every pair of declared features on the tiny reference run, refused
by the refusal table (checked: before any work, by fedhf, with the fix named) or checked by its oracle (equality
with a neutral twin, a statistical property, or "it trains"), and the features checked alone (algorithms, declared
refusals). 1-process configurations run in this process; every 2-process one (client_parallel, FSDP, clients
spread over processes) in one torchrun launch (one more after each configuration that crashes a launch). Prints
each failing pair, then one line:

    interaction_matrix features=<F> pairs=<P> refused=<R> equal=<E> statistical=<S> trains=<T> failing=<n> seconds=<s>

    python benchmarks/interaction_matrix.py [--out benchmarks/interaction_matrix_result.txt]
                                            [--page docs/interactions.md] [--only SUBSTRING]

With --page it also writes the generated docs page, taking each pair's refusal from the run (1-process pairs: the
build is the lookup; 2-process pairs: checked against the lookup) instead of looking every pair up again.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fedhf.interactions.features import features  # noqa: E402
from fedhf.interactions.matrix import REFUSED, alone, pairs  # noqa: E402
from fedhf.interactions.page import page  # noqa: E402
from fedhf.interactions.suite import run_pairs  # noqa: E402


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the failing pairs and the line to this file")
    parser.add_argument("--only", default=None, help="only pairs whose name contains this (a quick look)")
    parser.add_argument("--page", default=None, help="also write docs/interactions.md with the run's refusals")
    cli = parser.parse_args(argv)
    selected = [p for p in pairs() if cli.only is None or cli.only in p.name]
    lone = [f for f in alone() if cli.only is None or cli.only in f.name]
    lines = []
    report = run_pairs(selected, lone, log=lambda text: (print(text, flush=True), lines.append(text)))
    line = report.line(len(features()))
    if cli.page:
        refused = {v.name for v in report.verdicts if v.oracle == REFUSED}
        with open(cli.page, "w") as f:
            f.write(page(refused=lambda p: p.name in refused))
    print(line, flush=True)
    if cli.out:
        machine = (f"machine: {platform.node() or 'unknown'}, {os.cpu_count()} CPU cores, "
                   f"{platform.processor() or platform.machine()}, "
                   f"torch threads 1, {report.launches} torchrun launch(es); load average {os.getloadavg()[0]:.1f}")
        with open(cli.out, "w") as f:
            f.write("\n".join([machine] + lines + [line]) + "\n")
    return line


if __name__ == "__main__":
    main()
