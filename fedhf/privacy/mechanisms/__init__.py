"""Client-level DP mechanisms, one per ``dp_mode`` (besides "off"): the interface and its shared math in
:mod:`.base`, one module per mechanism, and the registry below. A new mechanism: its module with its class, one line
in :data:`MECHANISMS`, and its entry in tests/privacy/test_mechanism_conformance.py (docs/privacy.md, "Mechanisms")."""

from typing import Dict, Type

from .base import DPMechanism, MechanismPlan, gaussian_noised, noised_clip_update, planned_noise_multiplier
from .central import CentralGaussian
from .distributed import DistributedGaussian

#: dp_mode -> its mechanism (the dp_mode choices are "off" and these keys, in this order)
MECHANISMS: Dict[str, Type[DPMechanism]] = {
    "central": CentralGaussian,
    "distributed": DistributedGaussian,
}


def build_mechanism(dp_mode: str, plan: MechanismPlan) -> DPMechanism:
    return MECHANISMS[dp_mode](plan)


__all__ = ["MECHANISMS", "DPMechanism", "MechanismPlan", "build_mechanism", "gaussian_noised", "noised_clip_update",
           "planned_noise_multiplier"]
