"""Privacy of a client's message: joint L2 clipping (fixed or adaptive), a client-level accountant over
``dp-accounting``, and the numerics of secure aggregation (fixed-point encoding, pairwise masks mod 2^32).

Pure functions and thin classes; the round hook that applies them is fedhf/trainer/hooks/privacy.py.
"""

from .accountant import ACCOUNTANTS, SAMPLINGS, PrivacyAccountant, calibrate_noise, adaptive_noise_split
from .clipping import adaptive_clip_update, centred_bit, clip_jointly, joint_norm
from .secagg import SecAggCodec

__all__ = ["ACCOUNTANTS", "SAMPLINGS", "PrivacyAccountant", "calibrate_noise", "adaptive_noise_split",
           "adaptive_clip_update", "centred_bit", "clip_jointly", "joint_norm", "SecAggCodec"]
