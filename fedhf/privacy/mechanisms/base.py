"""The interface of a client-level DP mechanism (:class:`DPMechanism`), the numbers it is built from
(:class:`MechanismPlan`) and the pure functions every mechanism shares.

A mechanism of DP-FedAvg (McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018,
arXiv:1710.06963) releases, each round, the sum of the clients' messages, each clipped jointly to L2 norm C, plus
Gaussian noise of std z C. What a mechanism decides, and declares here:

* what it clips: the whole message, jointly, to C (:meth:`DPMechanism.clip`), and with adaptive clipping the
  server's update of C from the noised count of the clients' centred bits (Andrew et al., NeurIPS 2021,
  arXiv:1905.03871; :meth:`DPMechanism.next_clip_norm`);
* where the noise is added and how much: :attr:`~DPMechanism.noise_on_clients` / :attr:`~DPMechanism.noise_on_server`
  with :meth:`~DPMechanism.client_noise_std` and :meth:`~DPMechanism.server_noise_std` per element, drawn by
  :func:`gaussian_noised`; at :attr:`MechanismPlan.min_survivors` reports the sum carries std z_sums C;
* its accountant and calibration: the subsampled Gaussian of fedhf/privacy/accountant.py, z given or calibrated to
  the target epsilon (:meth:`~DPMechanism.noise_multiplier`), the sums' share z_sums after adaptive clipping's count
  (:meth:`~DPMechanism.sums_noise_multiplier`);
* what it releases: whether a round's sum may be released at all (:meth:`~DPMechanism.releases`), the range secure
  aggregation's codec must hold (:meth:`~DPMechanism.codec_range`) and what it adds to the round's log
  (:meth:`~DPMechanism.release_report`).

The classes are thin: the math is the pure functions below and those of accountant.py and clipping.py. The round
hook that applies a mechanism is fedhf/trainer/hooks/privacy.py; the config reads the plan
(fedhf/trainer/config/privacy_settings.py).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Dict, Mapping, Optional, Tuple

import torch

from ..accountant import PrivacyAccountant, adaptive_noise_split, calibrate_noise
from ..clipping import adaptive_clip_update, clip_jointly


@dataclass(frozen=True)
class MechanismPlan:
    """The numbers a mechanism is built from (the config's, with their defaults resolved)."""

    delta: float
    rounds: int  # the planned rounds (what a target epsilon is calibrated for)
    sampling: str  # "fixed" or "poisson"
    num_clients: int
    cohort: int  # the accounted cohort: every client whose data can enter a round
    expected_cohort: int  # DP-FedAvg's fixed denominator
    accountant: str = "rdp"  # "rdp" or "pld"
    noise_multiplier: Optional[float] = None  # z given; None: calibrated to target_epsilon
    target_epsilon: Optional[float] = None
    min_survivors: int = 1  # the fewest reports whose noise shares carry z_sums C (client noise only)
    adaptive_quantile: Optional[float] = None  # None: a fixed C
    adaptive_lr: float = 0.2
    count_std: float = 1.0  # adaptive clipping's noise on the clipped count


def planned_noise_multiplier(plan: MechanismPlan) -> float:
    """z: the given one, else the smallest that reaches ``target_epsilon`` after ``rounds`` rounds from below."""
    if plan.noise_multiplier is not None:
        return float(plan.noise_multiplier)
    return calibrate_noise(plan.target_epsilon, plan.delta, plan.rounds, plan.sampling, plan.num_clients,
                           plan.cohort, plan.accountant)


def gaussian_noised(tensors: Mapping[str, torch.Tensor], std: float,
                    generator: torch.Generator) -> Dict[str, torch.Tensor]:
    """Each tensor plus N(0, std^2) per element, drawn in the keys' sorted order (the draws do not depend on the
    order the tensors were added) in float64 on the CPU generator, then moved to the tensor's device."""
    return {k: tensors[k] + std * torch.randn(tensors[k].shape, generator=generator, dtype=torch.float64)
            .to(tensors[k].device) for k in sorted(tensors)}


def noised_clip_update(clip_norm: float, centred_count: float, plan: MechanismPlan,
                       generator: torch.Generator) -> float:
    """Adaptive clipping's next C from the sum of the centred bits plus N(0, count_std^2) (one draw)."""
    noisy = centred_count + plan.count_std * float(torch.randn((), generator=generator, dtype=torch.float64))
    return adaptive_clip_update(clip_norm, noisy, plan.expected_cohort, plan.adaptive_quantile, plan.adaptive_lr)


class DPMechanism(ABC):
    """One client-level DP mechanism (a ``dp_mode``), built from a :class:`MechanismPlan`. Subclasses declare where
    the noise goes and what a round releases; clipping, accounting and adaptive clipping are shared."""

    name: ClassVar[str]
    noise_on_clients: ClassVar[bool]  # each client adds a share of the noise (from its own secret) before the sum
    noise_on_server: ClassVar[bool]  # the server adds the noise to the sums (from the run's secret)
    needs_secure_aggregation: ClassVar[bool]  # the noise protects only if the server sees nothing but the sum
    server_knows_cohort: ClassVar[bool]  # the party that noises knows who took part: no amplification against it

    def __init__(self, plan: MechanismPlan) -> None:
        self.plan = plan

    # ------------------------------------------------------------------ accounting and calibration
    def noise_multiplier(self) -> float:
        return planned_noise_multiplier(self.plan)

    def sums_noise_multiplier(self, z: float) -> float:
        """The noise multiplier the sums get: z, or with adaptive clipping the part left after the count's share
        (Andrew et al., Theorem 1)."""
        return z if self.plan.adaptive_quantile is None else adaptive_noise_split(z, self.plan.count_std)

    def accountant(self, z: float) -> PrivacyAccountant:
        """The sampled Gaussian of multiplier z on the accounted cohort, composed over the rounds."""
        p = self.plan
        return PrivacyAccountant(z, p.delta, p.sampling, p.num_clients, p.cohort, p.accountant)

    # ------------------------------------------------------------------ what a client sends
    @property
    def adaptive(self) -> bool:
        return self.plan.adaptive_quantile is not None

    def clip(self, tensors: Mapping[str, torch.Tensor], clip_norm: float) -> Tuple[Dict[str, torch.Tensor], float]:
        """Every tensor scaled by one factor to joint norm <= C; and the norm before."""
        return clip_jointly(tensors, clip_norm)

    def next_clip_norm(self, clip_norm: float, centred_count: float, generator: torch.Generator) -> float:
        """Adaptive clipping's next C from the sum of the clients' centred bits (clipping.py's ``centred_bit``, which
        each client sends beside its message whatever the mechanism)."""
        return noised_clip_update(clip_norm, centred_count, self.plan, generator)

    # ------------------------------------------------------------------ the noise
    @abstractmethod
    def client_noise_std(self, z_sums: float, clip_norm: float) -> float:
        """The std per element one client adds to its clipped message (0 when the server noises)."""

    @abstractmethod
    def server_noise_std(self, z_sums: float, clip_norm: float) -> float:
        """The std per element the server adds to each protected sum (0 when the clients noise)."""

    def noised(self, tensors: Mapping[str, torch.Tensor], std: float,
               generator: torch.Generator) -> Dict[str, torch.Tensor]:
        return gaussian_noised(tensors, std, generator)

    # ------------------------------------------------------------------ the release
    @abstractmethod
    def releases(self, reports: int) -> bool:
        """Whether a round whose sum has ``reports`` clients' messages may be released."""

    @abstractmethod
    def codec_range(self, z_sums: float, clip_norm: float) -> float:
        """The range [-c, c] secure aggregation's codec needs for a clipped (and noised) message."""

    def release_report(self, accountant: PrivacyAccountant) -> Dict[str, float]:
        """What the round's log gets beside ``dp_epsilon`` (nothing by default)."""
        return {}


def share_noise_multiplier(z_sums: float, min_survivors: int) -> float:
    """One client's share of the noise per unit of C: z / sqrt(S_min), so that any S_min or more surviving shares sum
    to at least the accounted z C."""
    return z_sums / math.sqrt(min_survivors)
