"""Theta's vocabulary, shared by the axes that produce it (local optimizers) and those that move or measure it
(state sync, drift): how a Theta entry is keyed and what structure its tensor has (docs/algorithms.md 2.15, 4.1).

Theta is a flat dict of tensors keyed ``"<state key>:<parameter name>"``. Each optimizer declares the structure
of its state keys (:meth:`fedhf.optim.base.OptimizerHooks.theta_kind`); a compressor keeps that structure (a
symmetric PSD factor stays PSD, a non-negative second moment stays non-negative) without knowing the optimizer.
"""

from __future__ import annotations

from typing import Tuple

GENERAL = "general"  # any matrix (Muon's momentum)
SYMMETRIC_PSD = "symmetric"  # symmetric positive semi-definite (SOAP's L, R; FOOF's A)
NONNEGATIVE = "nonnegative"  # entry-wise >= 0 (second moments, Sophia's h, PreFed's P)
KINDS = (GENERAL, SYMMETRIC_PSD, NONNEGATIVE)


def theta_key(state_key: str, param_name: str) -> str:
    return f"{state_key}:{param_name}"


def split_theta_key(key: str) -> Tuple[str, str]:
    state_key, _, param_name = key.partition(":")
    return state_key, param_name
