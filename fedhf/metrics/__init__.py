"""Offline metrics (``evaluate.load`` needs the Hub), the preconditioner drift, and the run history plots."""

from .classification import accuracy_metrics, glue_compute_metrics
from .drift import drift, drift_message, spectral_drift
from .generation import (GenerationEvalCallback, first_word_accuracy, flowertune_accuracy, generate_answers,
                         unparseable_rate)
from .history import plot_history, write_json_atomic
from .loglik import LoglikScores, score_candidates

__all__ = ["GenerationEvalCallback", "LoglikScores", "accuracy_metrics", "drift", "drift_message",
           "first_word_accuracy", "flowertune_accuracy", "generate_answers", "glue_compute_metrics", "plot_history",
           "score_candidates", "spectral_drift", "unparseable_rate", "write_json_atomic"]
