"""Distributed DP: each client adds a share N(0, (z C)^2 / S_min) per element to its clipped message, from its own
secret, before secure aggregation; any S_min or more surviving shares sum to at least the accounted z C. The shares
are continuous Gaussians before the fixed-point codec, not the discrete Gaussian with modular clipping of Kairouz,
Liu, Steinke (ICML 2021), which fedhf does not implement (docs/privacy.md, "Distributed DP: clamping and rounding").

A round with fewer than S_min survivors carries less than the accounted noise and is not released. The server
knows who took part (it runs the secure sum), so against it sampling amplifies nothing: the round's log also holds
the epsilon without sampling (:meth:`PrivacyAccountant.epsilon_without_sampling`)."""

from __future__ import annotations

from typing import Dict

from ..accountant import PrivacyAccountant
from .base import DPMechanism, share_noise_multiplier


class DistributedGaussian(DPMechanism):
    name = "distributed"
    noise_on_clients = True
    noise_on_server = False
    needs_secure_aggregation = True
    server_knows_cohort = True

    def client_noise_std(self, z_sums: float, clip_norm: float) -> float:
        return share_noise_multiplier(z_sums, self.plan.min_survivors) * clip_norm

    def server_noise_std(self, z_sums: float, clip_norm: float) -> float:
        return 0.0

    def releases(self, reports: int) -> bool:
        return reports >= self.plan.min_survivors

    def codec_range(self, z_sums: float, clip_norm: float) -> float:
        """C widened by 4 stds of one client's share: an element is clamped only when its share's noise exceeds 4
        stds (at most about 6e-5 of them)."""
        return clip_norm * (1.0 + 4.0 * share_noise_multiplier(z_sums, self.plan.min_survivors))

    def release_report(self, accountant: PrivacyAccountant) -> Dict[str, float]:
        return {"dp_epsilon_vs_server_one_round": accountant.epsilon_without_sampling(1),
                "dp_epsilon_vs_server_every_round": accountant.epsilon_without_sampling(accountant.rounds)}
