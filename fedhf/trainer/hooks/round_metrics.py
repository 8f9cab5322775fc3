"""The preconditioner drift Delta_D as a round hook (the math: :mod:`fedhf.metrics.drift`).

The trainer hands each client's (w_i, Theta_i) to :meth:`DriftMetrics.on_client_message`, which adds the client's
drift sums as a message of its own (namespace ``drift``, 0 bytes: a diagnostic, not part of any algorithm's
uplink); the Frobenius form is read from the round's sums after the server update, the spectral form
(``drift_spectral``) from this process's clients' Theta_i kept for the round against their mean (one more small
all-reduce). No state-sync rule carries drift data."""

from __future__ import annotations

from typing import List, Tuple

from ...core.params import TensorDict
from ...metrics import drift, drift_message, spectral_drift
from .base import ClientMessages, RoundHook

NAMESPACE = "drift"


class DriftMetrics(RoundHook):
    def __init__(self, spectral: bool) -> None:
        self.spectral = bool(spectral)
        self.thetas: List[Tuple[float, TensorDict]] = []  # (w_i, Theta_i) of this process's clients, this round

    def before_round(self, trainer, run) -> None:
        self.thetas = []

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        if sent.theta:
            sent.components[NAMESPACE] = drift_message(sent.theta, ctx.weight)
        if self.spectral and sent.theta and trainer.world.sends_messages:  # each client counted once
            self.thetas.append((ctx.weight, sent.theta))
        return sent

    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        total_weight = sums.scalar("w")
        theta_sums = sums.within(NAMESPACE)
        spectral = (spectral_drift(self.thetas, theta_sums, total_weight, trainer.model_device)
                    if self.spectral else None)  # every process runs its all-reduce
        self.thetas = []
        entry.update({**(drift(theta_sums, total_weight) or {}), **(spectral or {})})
