"""Corrections, by name (the ``correction`` field of FederatedConfig)."""

from functools import partial

from ..core.registry import Registry
from .base import Correction
from .control_variate import ControlVariate
from .global_mix import GlobalMix
from .proximal import Proximal
from .tracking import ParameterTracking

CORRECTIONS: Registry[type] = Registry("correction", "correction")
CORRECTIONS.register("none")(Correction)
CORRECTIONS.register("proximal")(Proximal)
CORRECTIONS.register("control_variate")(ControlVariate)
CORRECTIONS.register("global_mix")(GlobalMix)
CORRECTIONS.register("control_variate_post")(partial(ParameterTracking, position="after"))  # FAdamET
CORRECTIONS.register("gradient_tracking")(partial(ParameterTracking, position="before"))  # FAdamGT

__all__ = ["CORRECTIONS", "Correction", "ControlVariate", "GlobalMix", "ParameterTracking", "Proximal"]
