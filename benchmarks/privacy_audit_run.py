"""The privacy audit of a whole run (benchmarks/privacy_audit.py runs it): canary clients through a real
multi-round ``FederatedTrainer`` run, scored on what the run releases (the final model and the history), against the
epsilon the run's history reports.

The run (Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024: canary clients
with random directions, the final model's change along each): ``canaries`` clients, one per direction u_i (the
basis vectors of a linear model w of ``canaries`` weights, so the directions are orthogonal and no canary's score
carries another's). Client i holds one row (index i, label s_i = +1 or -1, each with probability 1/2, drawn by the
auditor) and the loss -s_i w_i, so its local step moves w by lr s_i u_i whatever the global model is: a message of
norm lr >> C that fedhf's clip makes exactly s_i C u_i. The federation is the canaries alone: fixed-size sampling of
all of them every round (S = N, q = 1), so neighbouring runs are two runs that differ in one canary's sign, fedhf's
replace-one relation, and the accounted epsilon is the composed Gaussian of sigma / 2 (sensitivity 2C).

What fedhf does is its own: the trainer's local steps, the privacy hook's clip, noise (from the run's secret,
``draw_secret``, the operating system's entropy; ``dp_reproducible_noise`` stays off), adaptive clipping, noise
shares and secure aggregation, the server step, the accountant and the history. The auditor sees the released model
w_R (w_0 = 0) and reads each canary's score w_R[i]; the claim is the history's last ``dp_epsilon`` at the run's
``dp_delta``. The scores of the + and - canaries are two Gaussian samples of one variance (fixed clipped updates
plus Gaussian noise; under adaptive clipping the released C sequence is common to all canaries), so
fedhf/privacy/audit.py's :func:`canary_lower_bound` gives an exact lower confidence end of their separation mu and
epsilon(mu_lo, delta) bounds the release's epsilon from below.

The planted-seed attack reads the model card's seed: under the planted switch fedhf's noise comes from it, so the
auditor replays the published run on the same clients with every label 0 (no client moves the model; the release
is the noise alone, the same draws) and subtracts that release from the real one. Against the honest secret the
replay's noise is independent, so the subtraction only adds noise.
"""

from __future__ import annotations

import tempfile
from typing import Dict, List, Tuple

import datasets
import numpy as np
import torch
from torch import nn

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.privacy.audit import canary_lower_bound, guesses, one_run_guess_bound

RUN_MODES = ("central", "adaptive", "distributed")
PRINTED_SEED = 0  # the run's ``seed``: the model card prints it
DELTA = 1e-5
CLIP = 1.0
NOISE_MULTIPLIER = 2.5  # with 4 rounds the claim is about 7 (sigma / 2 per round), the planted accountant's about 3
ROUNDS = 4
GUESS_FRACTION = 0.1  # the share of canaries the one-run guess bound guesses (fixed before any run)


class CanaryScore(nn.Module):
    """w in R^canaries; a row (index i, label s) has loss -s w_i, whose gradient is -s u_i at every w."""

    def __init__(self, canaries: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(canaries, dtype=torch.float32))

    def forward(self, index=None, labels=None, **unused):
        score = self.weight[index]
        return {"loss": -(score * labels).mean(), "logits": score}


def canary_rows(signs: np.ndarray) -> datasets.Dataset:
    """Client i's one row: its index and its label s_i (0 in the planted-seed replay: no update)."""
    return datasets.Dataset.from_dict({"index": list(range(len(signs))), "labels": [float(s) for s in signs],
                                       "client": list(range(len(signs)))})


def run_config(mode: str, canaries: int, workdir: str) -> FederatedConfig:
    """The audited run: every canary a client, all of them in each of ``ROUNDS`` rounds (fixed sampling S = N)."""
    dp = dict(dp_mode="central", dp_clip_norm=CLIP, dp_noise_multiplier=NOISE_MULTIPLIER, dp_delta=DELTA,
              dp_accountant="rdp")
    if mode == "adaptive":
        dp.update(dp_adaptive_clip_quantile=0.5)  # the count's std: fedhf's default, the cohort / 20
    if mode == "distributed":
        dp.update(dp_mode="distributed", secure_aggregation=True)
    return FederatedConfig(
        output_dir=workdir, overwrite_output_dir=True, report_to="none", disable_tqdm=True, logging_strategy="no",
        save_strategy="no", use_cpu=True, seed=PRINTED_SEED, num_clients=canaries, clients_per_round=canaries,
        client_sampling="fixed", num_rounds=ROUNDS, local_steps=1, per_device_train_batch_size=1,
        eval_every_rounds=0, partition="natural", partition_column="client", partition_report=False,
        algorithm="fedavg", local_optimizer="sgd", learning_rate=100.0, weight_decay=0.0,
        round_lr_schedule="constant", max_grad_norm=0.0, **dp)


def released(mode: str, signs: np.ndarray) -> Tuple[np.ndarray, List[dict]]:
    """One run of fedhf: the released model's weights and the history."""
    with tempfile.TemporaryDirectory() as workdir:
        model = CanaryScore(len(signs))
        trainer = FederatedTrainer(model=model, args=run_config(mode, len(signs), workdir),
                                   train_dataset=canary_rows(signs))
        trainer.train()
        return model.weight.detach().to(torch.float64).numpy().copy(), list(trainer.federated_history)


def audit_run(mode: str, canaries: int, seed: int, replay: bool = False, confidence: float = 0.95) -> dict:
    """One audited run of ``mode`` (central, adaptive or distributed) with ``canaries`` canary clients whose signs
    come from the auditor's ``seed``; ``replay``: the planted-seed attack (subtract the replayed noise); the bound
    at ``confidence``."""
    signs = np.random.default_rng(seed).choice(np.array([-1.0, 1.0]), size=canaries)
    weights, history = released(mode, signs)
    if replay:
        noise_only, _ = released(mode, np.zeros(canaries))
        weights = weights - noise_only
    lb, detail = canary_lower_bound(weights[signs > 0], weights[signs < 0], DELTA, confidence)
    r, v = guesses(weights, signs, GUESS_FRACTION)
    return dict(lb=lb, claim=float(history[-1]["dp_epsilon"]), rounds=len(history), guesses=r, correct=v,
                one_run=one_run_guess_bound(canaries, r, v, DELTA, confidence), clip_norms=[h["dp_clip_norm"] for h in history],
                **detail)


def describe(result: Dict) -> str:
    return (f"lb={result['lb']:.3f} claim={result['claim']:.3f} (reported after {result['rounds']} rounds, "
            f"delta={DELTA}) mu_hat={result['mu_hat']:.3f} mu_lo={result['mu_lo']:.3f} canaries="
            f"{result['canaries']} one-run guesses {result['correct']}/{result['guesses']} "
            f"(Steinke et al. bound {result['one_run']:.2f})")
