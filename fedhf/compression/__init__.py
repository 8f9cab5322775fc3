"""Communication compression: compressors as pure encode/decode pairs (``COMPRESSORS``), the plan that picks one
per sent tensor, and the error-feedback step. The trainer's round hook (fedhf/trainer/hooks/compression.py) applies them
to the uplink and the downlink; docs/compression.md."""

from . import lowrank, quantize, sparsify  # noqa: F401  (their registry lines)
from .base import COMPRESSORS, Compressor, Encoded, build_compressor
from .feedback import compress_step
from .plan import CompressionPlan, parse_plan

__all__ = ["COMPRESSORS", "Compressor", "Encoded", "build_compressor", "compress_step", "CompressionPlan",
           "parse_plan"]
