"""Offline metrics (``evaluate.load`` needs the Hub) and the run history plots."""

from .classification import accuracy_metrics
from .history import plot_history, write_json_atomic

__all__ = ["accuracy_metrics", "plot_history", "write_json_atomic"]
