"""Offline metrics (``evaluate.load`` needs the Hub), the preconditioner drift, and the run history plots."""

from .classification import accuracy_metrics
from .drift import drift, spectral_drift
from .history import plot_history, write_json_atomic

__all__ = ["accuracy_metrics", "drift", "plot_history", "spectral_drift", "write_json_atomic"]
