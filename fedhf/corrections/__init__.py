"""Corrections, by name (the ``correction`` field of FederatedConfig)."""

from ..registry import Registry
from .base import Correction
from .control_variate import ControlVariate
from .global_mix import GlobalMix
from .proximal import Proximal

CORRECTIONS: Registry[type] = Registry("correction", "correction")
CORRECTIONS.register("none")(Correction)
CORRECTIONS.register("proximal")(Proximal)
CORRECTIONS.register("control_variate")(ControlVariate)
CORRECTIONS.register("global_mix")(GlobalMix)

__all__ = ["CORRECTIONS", "Correction", "ControlVariate", "GlobalMix", "Proximal"]
