"""Central DP (DP-FedAvg; McMahan et al., ICLR 2018, arXiv:1710.06963, Algorithm 1): the server adds N(0, (z C)^2)
per element to every protected sum, from the run's secret, in every round (an empty Poisson round too)."""

from __future__ import annotations

from .base import DPMechanism


class CentralGaussian(DPMechanism):
    name = "central"
    noise_on_clients = False
    noise_on_server = True
    needs_secure_aggregation = False
    server_knows_cohort = False  # the noise is the server's own: sampling hides who took part from the release

    def client_noise_std(self, z_sums: float, clip_norm: float) -> float:
        return 0.0

    def server_noise_std(self, z_sums: float, clip_norm: float) -> float:
        return z_sums * clip_norm

    def releases(self, reports: int) -> bool:
        return True  # the server's noise is the accounted noise, however few reported

    def codec_range(self, z_sums: float, clip_norm: float) -> float:
        return clip_norm * (1.0 + 4.0 * 0.0)  # no element of a clipped message exceeds C (the sum is noised after)
