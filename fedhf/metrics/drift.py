"""The preconditioner drift Delta_D: how far apart the participants' optimizer states Theta_i end a round
(FedPAC, Liu et al., 2025, Def. 1 and Fig. 3; docs/algorithms.md 2.15). Computed before alignment, over participants.

* Frobenius (always logged for algorithms with a Theta): Delta_D = sum_i w_i ||Theta_i - Thetabar||_F^2 / W, in
  its sum form sum_i w_i ||Theta_i||^2 / W - ||Thetabar||^2, from the two sums of :func:`drift_message` every
  client adds to the round's sums (float64; all-reducible like every other message; never counted as upload:
  a diagnostic a deployment would not send). Thetabar here is the mean of the clients' own Theta_i.
* Spectral (FedPAC Fig. 3, opt-in ``drift_spectral``): per Theta tensor k,
  D_k = sum_i w_i ||Theta_i,k - Thetabar_k||_2 / W, the spectral norm of the (shape[0], rest) matrix -- for
  the symmetric SOAP / FOOF factors, the largest |eigenvalue|; for a 1-D (diagonal) state, its largest |entry|.
  It is not a sum of per-client terms: each process keeps its clients' Theta_i until Thetabar is known (phase 1,
  the round's all-reduce), then the norms are summed (phase 2, a second small all-reduce). The paper's figure
  averages over clients; the weights w_i / W here are the ones Thetabar and the Frobenius form use. Both forms
  measure the clients' own Theta_i, whatever the state-sync rule uploads (``compressed_average`` sends a low-rank
  reconstruction; the drift is that of the optimizers' states, as FedPAC defines it).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ..core.message import Message
from ..core.params import TensorDict
from ..core.sums import RoundSums


def drift_message(theta: TensorDict, weight: float) -> Message:
    """One client's part of the drift sums: w_i Theta_i and w_i ||Theta_i||^2 per tensor (0 bytes: not sent by a
    deployment). Empty for an optimizer without a Theta."""
    message = Message()
    if theta:
        message.put("theta", theta, scale=weight, nbytes=0)
        message.put("theta_sq", {k: t.double().pow(2).sum() for k, t in theta.items()}, scale=weight, nbytes=0)
    return message


def drift(sums, total_weight: float) -> Optional[dict]:
    """Delta_D = sum_i w_i ||Theta_i||^2 / W - ||Thetabar||^2 (sum form, float64), and it relative to the mean
    squared norm (for comparing optimizers). None when no Theta was contributed."""
    # Sorted: the float64 sums then do not depend on the order the clients' Theta entries were first added.
    keys = sorted(k[len("theta_sq."):] for k in sums.keys() if k.startswith("theta_sq."))
    if not keys or total_weight <= 0:
        return None
    mean_sq = sum(sums.scalar(f"theta_sq.{k}") for k in keys) / total_weight
    sq_of_mean = sum(float((sums.get(f"theta.{k}") / total_weight).pow(2).sum()) for k in keys)
    delta = max(mean_sq - sq_of_mean, 0.0)  # cancellation can make it a hair negative
    return {"precond_drift": delta, "precond_drift_rel": delta / mean_sq if mean_sq > 0 else 0.0}


def spectral_norm(t: torch.Tensor) -> float:
    """||t||_2 of t as a (shape[0], rest) matrix; a 1-D tensor is a diagonal matrix (its largest |entry|)."""
    t = t.double()
    if t.ndim <= 1:
        return float(t.abs().max()) if t.numel() else 0.0
    return float(torch.linalg.matrix_norm(t.reshape(t.shape[0], -1), ord=2))


def spectral_drift(thetas: List[Tuple[float, TensorDict]], sums, total_weight: float,
                   device: Optional[torch.device] = None) -> Optional[Dict[str, float]]:
    """Phase 2: this process's clients' (w_i, Theta_i) against Thetabar from the all-reduced sums; one more
    all-reduce (a no-op in one process) adds the processes' parts. Every process must call it (with an empty
    list if it trained no client; ``device``: the model's, where the all-reduce runs). Returns ``precond_drift_spectral`` (the mean of D_k over tensors),
    ``precond_drift_spectral_max`` and one ``precond_drift_spectral/<key>`` per Theta tensor."""
    if total_weight <= 0:
        return None
    part = RoundSums()
    for weight, theta in thetas:
        for key, value in theta.items():
            mean = sums.get(f"theta.{key}") / total_weight
            part.add(f"norm.{key}", spectral_norm(value.double() - mean), scale=weight)
    part.all_reduce(device=device)
    per_key = {k[len("norm."):]: part.scalar(k) / total_weight for k in sorted(part.keys())}
    if not per_key:
        return None
    values = list(per_key.values())
    return {"precond_drift_spectral": sum(values) / len(values), "precond_drift_spectral_max": max(values),
            **{f"precond_drift_spectral/{key}": value for key, value in per_key.items()}}
