"""An empirical privacy audit of fedhf's client-level DP: a canary client, many rounds with and without it, and an
epsilon lower bound from how well a threshold tells the two apart.

    python benchmarks/privacy_audit.py [--trials 20000] [--cohort 8] [--seed 0]

What runs is fedhf's own round hook (fedhf/trainer/hooks/privacy.py), built from a real ``FederatedConfig``: every client's
message goes through ``Privacy.on_client_message`` (clip, distributed noise share, secure aggregation's quantise and
mask) and the summed messages through ``Privacy.after_sums`` (unmask and decode, central noise, adaptive clipping's
noisy count), in the shapes the trainer uses (``Message`` / ``RoundSums``, as fedhf/trainer/runners/local_steps.py sends
them). Nothing of clip + noise is written again here; every call into fedhf's privacy code is in the first section
below (the config, ``Mechanism``, the planted clip, the claim).

The audit (Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning: How Private is Private
SGD?", NeurIPS 2020, arXiv:2006.07709; Nasr, Song, Thakurta, Papernot, Carlini, "Adversary Instantiation: Lower
Bounds for Differentially Private Machine Learning", IEEE S&P 2021, arXiv:2101.04535):

* a cohort of ``cohort - 1`` ordinary clients (fixed updates: the auditor knows everything but the noise) and one
  canary client, which sends a fixed direction u of norm 2C in "with" trials and a zero update in "without" trials
  (it takes part in both, so the cohort and the distributed noise shares are the same; the released sums differ by
  the canary's clipped vector, norm C: the add-or-remove-one sensitivity);
* each trial is one round with fresh noise (a fresh hook: the first round of a run, at round index = trial number);
* the score is the released sum's projection on u; a threshold t says "with" above it;
* with Clopper-Pearson upper ends FPR+ and FNR+ (two-sided 95 % intervals, so both hold together with >= 95 %
  confidence), an (epsilon, delta)-DP mechanism must satisfy epsilon >= log((1 - delta - FNR+) / FPR+) and the
  symmetric log((1 - delta - FPR+) / FNR+). The first half of each world's trials chooses t and the form (the
  largest bound there), the second half measures the rates at it and gives ``lb`` (choosing on the same trials
  would bias the bound upwards).

The claim is the epsilon fedhf's accountant (fedhf/privacy/accountant.py, dp-accounting's PLD, the tightest) gives
the noise multiplier z the hook accounts, for what the audit ran: one round, the canary always in the cohort, so no
sampling amplification; ``PoissonSampledDpEvent`` with q = 1 is exactly the unamplified Gaussian mechanism of
sensitivity C and std z C under add-or-remove-one neighbours. (A run's model card reports the amplified, composed
epsilon of its sampling; this audit tests the mechanism that amplification is applied to.) Under adaptive clipping
z covers the sums and the noisy count together (Andrew et al. 2021); the score reads the sums only, so the bound is
of part of the release, which post-processing makes a valid lower bound still.

delta is 1e-2 for every mode and claim: at a large delta the test that attains the claimed epsilon works at
false-positive rates that tens of thousands of trials measure (at 1e-5 it needs rates near 1e-5), so the audit is
close to tight; the claim is computed at the same delta, so the comparison stays fair.

Modes: ``central`` (fixed C, central noise), ``adaptive`` (the quantile estimator on), ``distributed`` (each client's
noise share, secure aggregation's 20-bit encoding and masks), and two planted breaks the audit must catch (lb >
claim): ``planted_seed``, central noise from a generator of a seed the auditor knows (it regenerates the noise with
the same hook fed zero updates and subtracts it), and ``planted_sens``, clients clipping at 2C while the noise is
calibrated for C. One run cannot prove privacy: lb is a lower bound on the true epsilon, so lb <= claim is what an
honest mechanism shows and lb > claim proves a violation (at 95 % confidence). One-run auditing (Steinke, Nasr,
Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023, arXiv:2305.08846) would insert many canaries
into one run; here each trial is one round, which is cheap, so plain repetition is used.

The last line is ``privacy_audit central=<lb>/<claim> adaptive=<lb>/<claim> distributed=<lb>/<claim>
planted_seed=<lb> planted_sens=<lb>``; the output is deterministic given ``--seed`` (the audit's own seed: the central
noise's generator is set from it, and where fedhf has ``dp_reproducible_noise`` the config turns it on, so the
distributed shares and masks follow the seed too).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import math
import os
import platform
import sys
import tempfile
import time
import types
from typing import Dict, Iterator, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy.stats import beta  # noqa: E402

import fedhf.trainer.hooks.privacy as privacy_hook  # noqa: E402
from fedhf import FederatedConfig  # noqa: E402
from fedhf.core.message import Message  # noqa: E402
from fedhf.core.sums import RoundSums  # noqa: E402
from fedhf.privacy import PrivacyAccountant  # noqa: E402
from fedhf.trainer.hooks.base import ClientMessages  # noqa: E402

DELTA = 1e-2
NOISE_MULTIPLIER = 1.0
CLIP = 1.0
CANARY_NORM = 2.0 * CLIP  # >= C; 2C so that clients clipping at 2C (planted_sens) send all of it
DIM = 16  # the message's length; the projection on u sees one dimension of isotropic noise whatever DIM is
CANARY = 0  # the canary's client id
ADAPTIVE_COUNT_STD = 1.0  # the sums then get z_delta = (1 - 1/4)^-1/2 = 1.155
PLANTED_SEED = 1234  # the seed the planted_seed break's noise comes from, known to the auditor
HONEST = ("central", "adaptive", "distributed")
PLANTED = ("planted_seed", "planted_sens")
MODES = HONEST + PLANTED
CONFIDENCE = 0.95


# ------------------------------------------------ fedhf's mechanism: the only calls into its privacy code
def audit_config(mode: str, cohort: int, seed: int, workdir: str) -> FederatedConfig:
    """The run the audit plays: ``cohort`` clients, all in every round (fixed sampling of N = S)."""
    dp = dict(dp_mode="central", dp_clip_norm=CLIP, dp_noise_multiplier=NOISE_MULTIPLIER, dp_delta=DELTA)
    if mode == "adaptive":
        # the count's noise: Andrew et al.'s default, cohort / 20, is too small for z = 1 with a cohort this small
        dp.update(dp_adaptive_clip_quantile=0.5, dp_adaptive_clip_count_std=ADAPTIVE_COUNT_STD)
    if mode == "distributed":
        dp.update(dp_mode="distributed", secure_aggregation=True)
    fields = {f.name for f in dataclasses.fields(FederatedConfig)}
    if "dp_reproducible_noise" in fields:  # noise from the seed (the audit must be repeatable), said by the setting
        dp["dp_reproducible_noise"] = True
    return FederatedConfig(output_dir=workdir, report_to="none", disable_tqdm=True, logging_strategy="no",
                           save_strategy="no", use_cpu=True, seed=seed, num_clients=cohort,
                           clients_per_round=cohort, num_rounds=1, client_sampling="fixed", **dp)


@contextlib.contextmanager
def clients_clip_at(factor: float) -> Iterator[None]:
    """planted_sens: the clients clip at ``factor`` C while the hook's noise stays calibrated for C."""
    honest = privacy_hook.clip_jointly
    privacy_hook.clip_jointly = lambda items, clip_norm: honest(items, factor * clip_norm)
    try:
        yield
    finally:
        privacy_hook.clip_jointly = honest


class Mechanism:
    """One round of fedhf's privacy hook on given client updates. Each round gets a fresh hook (a shallow copy of
    one built from the config: the first round of a run, so adaptive clipping starts at C), whose central noise
    comes from ``noise``, one generator across the rounds."""

    def __init__(self, args: FederatedConfig, noise: torch.Generator) -> None:
        self.trainer = types.SimpleNamespace(args=args)  # the hook reads only the trainer's args
        self.built = privacy_hook.Privacy(self.trainer)
        self.built.noise = noise

    def accounted_noise_multiplier(self) -> float:
        return self.built.z

    def release(self, updates: Dict[int, torch.Tensor], round_index: int) -> torch.Tensor:
        """The released (noised, decoded) sum of the clients' ``dx`` after round ``round_index``."""
        hook = copy.copy(self.built)
        # the run's state the hook reads: the round index, the round's clients (they began it: the secure sum's
        # partners), and the global model, which only an empty round needs
        run = types.SimpleNamespace(rounds_done=round_index, cohort=sorted(updates), started=sorted(updates),
                                    global_params={}, global_buffers={})
        hook.before_round(self.trainer, run)
        sums = RoundSums()
        for client, update in sorted(updates.items()):  # as LocalSteps.finish sends a client's messages
            own = Message().put("dx", {"update": update}).put_scalar("w", 1.0).put_scalar("n", 1.0)
            own.put_scalar("loss", 0.0)
            sent = ClientMessages(own, {"correction": Message(), "sync": Message(), "server": Message()})
            sent = hook.on_client_message(self.trainer, types.SimpleNamespace(round=round_index, client_id=client),
                                          sent)
            sums.add_message(sent.own)
            for namespace, message in sent.components.items():
                sums.add_message(message, namespace)
        hook.after_sums(self.trainer, run, sums)
        return sums.get("dx.update")


def claimed_epsilon(z: float, cohort: int) -> float:
    """fedhf's accountant for one round with the canary's participation fixed: q = 1, no amplification."""
    return PrivacyAccountant(z, DELTA, "poisson", cohort, cohort, kind="pld").epsilon(1)


# ------------------------------------------------------------------ the statistics
def rates_upper(errors: np.ndarray, trials: int) -> np.ndarray:
    """Clopper-Pearson: the upper ends of the two-sided 95 % intervals of error rates (errors of ``trials``)."""
    errors = np.asarray(errors)
    inside = np.minimum(errors, trials - 1)  # the end is 1 where every trial erred
    upper = beta.ppf(1.0 - (1.0 - CONFIDENCE) / 2.0, inside + 1, trials - inside)
    return np.where(errors >= trials, 1.0, upper)


def epsilon_bounds(without: np.ndarray, with_: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """The two lower bounds at each threshold ("with" above it), shape (2, thresholds): from FPR+ (the form
    log((1 - delta - FNR+) / FPR+)) and from FNR+ (the symmetric one); 0 where vacuous."""
    false_positives = len(without) - np.searchsorted(np.sort(without), thresholds, side="right")
    false_negatives = np.searchsorted(np.sort(with_), thresholds, side="right")
    fpr, fnr = rates_upper(false_positives, len(without)), rates_upper(false_negatives, len(with_))
    forms = np.stack([(1.0 - DELTA - fnr, fpr), (1.0 - DELTA - fpr, fnr)])  # (form, numerator/denominator, t)
    return np.where(forms[:, 0] > forms[:, 1], np.log(np.maximum(forms[:, 0], 1e-300) / forms[:, 1]), 0.0)


def epsilon_lower_bound(without: np.ndarray, with_: np.ndarray) -> Tuple[float, dict]:
    """The threshold and form chosen on the first half of each world's trials (the largest bound there, over every
    midpoint between two of their scores), the bound measured on the second half."""
    half_out, half_in = len(without) // 2, len(with_) // 2
    choose_out, choose_in = without[:half_out], with_[:half_in]
    scores = np.unique(np.concatenate([choose_out, choose_in]))
    candidates = (scores[1:] + scores[:-1]) / 2.0
    chosen = epsilon_bounds(choose_out, choose_in, candidates)
    form, index = np.unravel_index(int(np.argmax(chosen)), chosen.shape)
    threshold = float(candidates[index])
    test_out, test_in = without[half_out:], with_[half_in:]
    lb = float(epsilon_bounds(test_out, test_in, np.array([threshold]))[form, 0])
    detail = dict(threshold=threshold, false_positives=int((test_out > threshold).sum()),
                  false_negatives=int((test_in <= threshold).sum()), per_world=len(test_out))
    return lb, detail


# ------------------------------------------------------------------ one mode
def audit(mode: str, trials: int, cohort: int, seed: int) -> dict:
    """``trials`` rounds (half with the canary, alternating) of one mode; its lb and claim."""
    start = time.process_time()
    draws = torch.Generator().manual_seed(seed)
    canary = torch.randn(DIM, generator=draws, dtype=torch.float64)
    direction = canary / canary.norm()
    ordinary = {c: torch.randn(DIM, generator=draws, dtype=torch.float64) for c in range(1, cohort)}
    ordinary = {c: v * (3.0 * CLIP / v.norm()) for c, v in ordinary.items()}  # all above C: clipped, like the canary
    with tempfile.TemporaryDirectory() as workdir:
        args = audit_config("central" if mode in PLANTED else mode, cohort, seed, workdir)
        secret = torch.Generator().manual_seed(PLANTED_SEED if mode == "planted_seed" else seed + 1)
        mechanism = Mechanism(args, secret)
        z = mechanism.accounted_noise_multiplier()
        # planted_seed: the auditor's copy of the noise, the same hook fed zero updates from the known seed
        replica = Mechanism(args, torch.Generator().manual_seed(PLANTED_SEED)) if mode == "planted_seed" else None
        scores: List[List[float]] = [[], []]
        with clients_clip_at(2.0) if mode == "planted_sens" else contextlib.nullcontext():
            for k in range(trials):
                present = k % 2 == 0
                updates = {CANARY: direction * CANARY_NORM if present else torch.zeros(DIM, dtype=torch.float64),
                           **ordinary}
                released = mechanism.release(updates, k)
                if replica is not None:
                    released = released - replica.release({c: torch.zeros(DIM, dtype=torch.float64)
                                                           for c in updates}, k)
                # at a resolution of 1e-9 (C = 1): two roundings of one value are one score, so no threshold
                # falls between them (a known-seed subtraction leaves the sums exact up to float64 rounding)
                scores[present].append(round(float(released @ direction), 9))
    lb, detail = epsilon_lower_bound(np.array(scores[0]), np.array(scores[1]))
    return dict(mode=mode, lb=lb, claim=claimed_epsilon(z, cohort), z=z, cpu_seconds=time.process_time() - start,
                **detail)


def summary_line(results: Dict[str, dict]) -> str:
    honest = " ".join(f"{m}={results[m]['lb']:.2f}/{results[m]['claim']:.2f}" for m in HONEST)
    planted = " ".join(f"{m}={results[m]['lb']:.2f}" for m in PLANTED)
    return f"privacy_audit {honest} {planted}"


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{model}, {os.cpu_count()} cores, no GPU used, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def run_audit(trials: Dict[str, int], cohort: int, seed: int, log=print) -> Dict[str, dict]:
    """Every mode, with ``trials[mode]`` rounds each."""
    results = {}
    for mode in MODES:
        result = results[mode] = audit(mode, trials[mode], cohort, seed)
        log(f"{mode:13s} lb={result['lb']:.3f} claim={result['claim']:.3f} (z={result['z']:.4g}, delta={DELTA}) "
            f"threshold={result['threshold']:.4g} FP={result['false_positives']}/{result['per_world']} "
            f"FN={result['false_negatives']}/{result['per_world']} {result['cpu_seconds']:.1f} CPU s")
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20_000, help="rounds per mode (half with the canary)")
    parser.add_argument("--cohort", type=int, default=8, help="clients per round, the canary included")
    parser.add_argument("--seed", type=int, default=0, help="the audit's own seed (its output is a function of it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"machine: {machine()}")
    print(f"trials per mode {args.trials} (half with the canary; half of each chooses the threshold), cohort "
          f"{args.cohort}, C={CLIP}, canary norm {CANARY_NORM}, z={NOISE_MULTIPLIER}, delta={DELTA}, seed {args.seed}")
    start = time.process_time()
    results = run_audit({mode: args.trials for mode in MODES}, args.cohort, args.seed)
    print(f"total {time.process_time() - start:.0f} CPU s (one thread)")
    print(summary_line(results))


if __name__ == "__main__":
    main()
