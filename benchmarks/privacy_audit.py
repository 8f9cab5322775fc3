"""An empirical privacy audit of fedhf's client-level DP, compared with the epsilon fedhf reports; three planted
regressions it must catch.

    python benchmarks/privacy_audit.py [--canaries 1000] [--distributed-canaries 400] [--trials 20000] [--seed 0]

Two parts (the statistics: fedhf/privacy/audit.py):

1. **A whole run** (benchmarks/privacy_audit_run.py): canary clients through a real multi-round ``FederatedTrainer``
   run with fedhf's own secret, noise, sampling and accountant, scored on the released model, against the
   history's reported ``dp_epsilon``. Modes ``central``, ``adaptive`` and ``distributed`` (secure aggregation and
   noise shares), honest; ``planted_seed`` (central, fedhf's secret planted to be the printed seed, the auditor
   replays the run and subtracts the noise) and ``planted_accountant`` (central, fixed-size sampling accounted without
   the replace-one factor 2: the history reports about 3.7 for a true 8).
2. **One round, many trials** (this file; the unit check of the hook): a canary client through fedhf's privacy hook
   (``Privacy.on_client_message`` / ``after_sums`` as the trainer calls them, with the hook's own secret), one fresh
   round per trial, half with the canary; a threshold test and Clopper-Pearson rates; the claim is the epsilon the
   hook's accountant puts in the history after that round (Poisson with q = 1: no amplification, the canary is in the
   round; delta 1e-2, where the test that attains the claim works at rates tens of thousands of trials measure).
   ``central`` and ``distributed`` score the released sum's projection on the canary's direction u (canary 2C u,
   clipped to C, or a zero update); ``adaptive`` is count-aware: the canary is present with norm 0.999 C (its bit
   counts) or absent, and the score adds the noisy count read back from the released next C to the projection, each
   weighted by its inverse noise variance (the likelihood ratio of the pair); ``planted_bit`` is that audit with
   adaptive clipping's bit uncentred (b_i in {0, 1}), which doubles the count's sensitivity under add-or-remove;
   ``planted_sens`` is ``central`` with clients clipping at 2C.

The planted switches (benchmarks/privacy_audit_planted.py) replace one fedhf function in this process only. lb is a
95 % lower confidence bound on the true epsilon: lb <= claim is what an honest mechanism shows, lb > claim proves a
violation. The secret is the operating system's, so every run draws fresh noise and the numbers vary within their
confidence (the canary signs and the unit trials' client updates follow ``--seed``).

The last line is ``privacy_audit_run central=<lb>/<claim> adaptive=<lb>/<claim> distributed=<lb>/<claim>
planted_bit=<lb>/<claim> planted_seed=<lb>/<claim> planted_accountant=<lb>/<claim>`` (planted_bit from part 2, the
rest from part 1).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import platform
import sys
import tempfile
import time
import types
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import fedhf.trainer.hooks.privacy as privacy_hook  # noqa: E402
from fedhf import FederatedConfig  # noqa: E402
from fedhf.core.client_store import ClientStateStore  # noqa: E402
from fedhf.core.message import Message  # noqa: E402
from fedhf.core.sums import RoundSums  # noqa: E402
from fedhf.privacy.audit import threshold_lower_bound  # noqa: E402
from fedhf.trainer.hooks.base import ClientMessages  # noqa: E402
from privacy_audit_planted import clients_clip_at, planted  # noqa: E402
import privacy_audit_run as whole_run  # noqa: E402

DELTA = 1e-2
NOISE_MULTIPLIER = 1.0
CLIP = 1.0
CANARY_NORM = 2.0 * CLIP  # >= C; 2C so that clients clipping at 2C (planted_sens) send all of it
BELOW_NORM = 0.999 * CLIP  # the count-aware canary: under C, so its bit is "below"
DIM = 16
CANARY = 0
COUNT_STD = 0.6  # adaptive's count noise: the sums then get z_delta = (1 - (2 x 0.6)^-2)^-1/2 = 1.809
UNIT_MODES = ("central", "adaptive", "distributed", "planted_sens", "planted_bit")
LINE = ("central", "adaptive", "distributed", "planted_bit", "planted_seed", "planted_accountant")


# ------------------------------------------------ one round of fedhf's hook
def unit_config(mode: str, cohort: int, seed: int, workdir: str) -> FederatedConfig:
    """One round with every client in it: Poisson with q = clients_per_round / num_clients = 1 (distributed: fixed
    sampling of all of them, whose replace-one claim covers replacing the canary by a zero update)."""
    dp = dict(dp_mode="central", dp_clip_norm=CLIP, dp_noise_multiplier=NOISE_MULTIPLIER, dp_delta=DELTA,
              dp_accountant="pld")
    if mode in ("adaptive", "planted_bit"):
        dp.update(dp_adaptive_clip_quantile=0.5, dp_adaptive_clip_count_std=COUNT_STD)
    sampling = "poisson"
    if mode == "distributed":  # fedhf refuses distributed DP with Poisson: fixed S = N, replace-one, RDP
        dp.update(dp_mode="distributed", secure_aggregation=True, dp_accountant="rdp")
        sampling = "fixed"
    return FederatedConfig(output_dir=workdir, report_to="none", disable_tqdm=True, logging_strategy="no",
                           save_strategy="no", use_cpu=True, seed=seed, num_clients=cohort, clients_per_round=cohort,
                           num_rounds=1, client_sampling=sampling, **dp)


class Mechanism:
    """One round of fedhf's privacy hook on given client updates; each round a fresh shallow copy of one hook built
    from the config (the first round of a run: adaptive clipping starts at C), whose noise comes from the run's
    secret (drawn once, as a run draws it)."""

    def __init__(self, args: FederatedConfig) -> None:
        # the hook reads the trainer's args and its algorithm's correction (the secure sum's layout)
        self.trainer = types.SimpleNamespace(args=args, algorithm=args.built_algorithm())
        self.built = privacy_hook.Privacy(self.trainer)
        self.store = ClientStateStore()  # the clients' devices: each one's share secret under distributed DP

    def reported_epsilon(self) -> float:
        """What the hook writes to the history's ``dp_epsilon`` after one round (a fresh hook: the same
        accountant)."""
        entry: dict = {}
        privacy_hook.Privacy(self.trainer).after_aggregate(self.trainer, None, None, entry)
        return float(entry["dp_epsilon"])

    def release(self, updates: Dict[int, torch.Tensor], round_index: int):
        """The released (noised, decoded) sum of the clients' ``dx`` after round ``round_index``, and the hook (its
        ``clip_norm`` is the released next C)."""
        hook = copy.copy(self.built)
        run = types.SimpleNamespace(rounds_done=round_index, cohort=sorted(updates), started=sorted(updates),
                                    global_params={}, global_buffers={})
        hook.before_round(self.trainer, run)
        sums = RoundSums()
        for client, update in sorted(updates.items()):  # as ClientRound.finish sends a client's messages
            own = Message().put("dx", {"update": update}).put_scalar("w", 1.0).put_scalar("n", 1.0)
            own.put_scalar("loss", 0.0)
            sent = ClientMessages(own, {"correction": Message(), "sync": Message(), "server": Message()})
            ctx = types.SimpleNamespace(round=round_index, client_id=client, store=self.store,
                                        global_params={"update": torch.zeros_like(update)})
            sent = hook.on_client_message(self.trainer, ctx, sent)
            sums.add_message(sent.own)
            for namespace, message in sent.components.items():
                sums.add_message(message, namespace)
        hook.after_sums(self.trainer, run, sums)
        return sums.get("dx.update"), hook


def noisy_count(next_clip: float, args) -> float:
    """The noisy centred count read back from the released next C (C exp(-eta (fraction - gamma)), unclamped)."""
    fraction = args.dp_adaptive_clip_quantile - math.log(next_clip / args.dp_clip_norm) / args.dp_adaptive_clip_lr
    return args.clients_per_round * (fraction - 0.5)


def unit_audit(mode: str, trials: int, cohort: int, seed: int) -> dict:
    """``trials`` rounds (half with the canary, alternating) of one unit mode; its lb and reported claim."""
    start = time.process_time()
    draws = torch.Generator().manual_seed(seed)
    direction = torch.randn(DIM, generator=draws, dtype=torch.float64)
    direction = direction / direction.norm()
    count_aware = mode in ("adaptive", "planted_bit")
    ordinary = {}
    for c in range(1, cohort):  # over C (clipped, like the canary); count-aware: one under C, so the noisy
        v = torch.randn(DIM, generator=draws, dtype=torch.float64)  # fraction stays inside (0, 1) either way
        ordinary[c] = v * ((0.5 if count_aware and c == 1 else 3.0) * CLIP / v.norm())
    with tempfile.TemporaryDirectory() as workdir, contextlib.ExitStack() as switches:
        switches.enter_context(planted("planted_bit" if mode == "planted_bit" else "honest"))
        if mode == "planted_sens":
            switches.enter_context(clients_clip_at(2.0))
        args = unit_config("central" if mode == "planted_sens" else mode, cohort, seed, workdir)
        mechanism = Mechanism(args)
        z_sums = mechanism.built.z_sums
        scores: List[List[float]] = [[], []]
        for k in range(trials):
            present = k % 2 == 0
            if count_aware:
                updates = {**({CANARY: direction * BELOW_NORM} if present else {}), **ordinary}
            else:
                canary = direction * CANARY_NORM if present else torch.zeros(DIM, dtype=torch.float64)
                updates = {CANARY: canary, **ordinary}
            released, hook = mechanism.release(updates, k)
            score = float(released @ direction)
            if count_aware:  # the likelihood ratio's statistic of the (sum, count) pair
                score = score / (z_sums ** 2 * CLIP) + noisy_count(hook.clip_norm, args) / COUNT_STD ** 2
            scores[present].append(round(score, 9))
        claim = mechanism.reported_epsilon()
    lb, detail = threshold_lower_bound(np.array(scores[0]), np.array(scores[1]), DELTA)
    return dict(mode=mode, lb=lb, claim=claim, z=mechanism.built.z, cpu_seconds=time.process_time() - start,
                **detail)


# ------------------------------------------------ the whole audit
def run_modes(canaries: Dict[str, int], seed: int, confidence: float) -> Dict[str, dict]:
    """Part 1: each whole-run mode with ``canaries[mode]`` canary clients."""
    plan = {"central": ("central", "honest", False), "adaptive": ("adaptive", "honest", False),
            "distributed": ("distributed", "honest", False), "planted_seed": ("central", "planted_seed", True),
            "planted_accountant": ("central", "planted_accountant", False),
            "central_replayed": ("central", "honest", True)}  # the seed attack on the honest secret
    results = {}
    for name, count in canaries.items():
        mode, switch, replay = plan[name]
        start = time.process_time()
        with planted(switch, whole_run.PRINTED_SEED):
            results[name] = whole_run.audit_run(mode, count, seed, replay, confidence)
        results[name]["cpu_seconds"] = time.process_time() - start
    return results


def unit_modes(trials: Dict[str, int], cohort: int, seed: int) -> Dict[str, dict]:
    return {mode: unit_audit(mode, count, cohort, seed) for mode, count in trials.items()}


def summary_line(results: Dict[str, dict]) -> str:
    return "privacy_audit_run " + " ".join(f"{m}={results[m]['lb']:.2f}/{results[m]['claim']:.2f}" for m in LINE)


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{model}, {os.cpu_count()} cores, no GPU used, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--canaries", type=int, default=1000, help="canary clients per whole run")
    parser.add_argument("--distributed-canaries", type=int, default=400,
                        help="canary clients of the distributed run (secure aggregation's masks cost N^2)")
    parser.add_argument("--trials", type=int, default=20_000, help="one-round trials per unit mode")
    parser.add_argument("--cohort", type=int, default=8, help="clients per unit round, the canary included")
    parser.add_argument("--seed", type=int, default=0, help="the auditor's seed (canary signs, client updates)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"machine: {machine()}")
    start = time.process_time()
    canaries = {m: args.canaries for m in ("central", "adaptive", "planted_seed", "planted_accountant",
                                           "central_replayed")}
    canaries["distributed"] = args.distributed_canaries
    print(f"part 1, whole runs: {whole_run.ROUNDS} rounds, every canary in every round (fixed sampling S = N), "
          f"C={whole_run.CLIP}, z={whole_run.NOISE_MULTIPLIER}, delta={whole_run.DELTA}, confidence 95 %")
    results = run_modes(canaries, args.seed, 0.95)
    for name, result in results.items():
        print(f"{name:19s} {whole_run.describe(result)} {result['cpu_seconds']:.1f} CPU s")
    print(f"part 2, one round x {args.trials} trials (half with the canary), cohort {args.cohort}, C={CLIP}, "
          f"z={NOISE_MULTIPLIER}, delta={DELTA}, adaptive count std {COUNT_STD}")
    units = unit_modes({m: args.trials for m in UNIT_MODES}, args.cohort, args.seed)
    for mode, r in units.items():
        print(f"{mode:19s} lb={r['lb']:.3f} claim={r['claim']:.3f} (reported after 1 round, z={r['z']:.4g}) "
              f"threshold={r['threshold']:.4g} FP={r['false_positives']}/{r['per_world']} "
              f"FN={r['false_negatives']}/{r['per_world']} {r['cpu_seconds']:.1f} CPU s")
    print(f"total {time.process_time() - start:.0f} CPU s (one thread)")
    print(summary_line({**results, "planted_bit": units["planted_bit"]}))


if __name__ == "__main__":
    main()
