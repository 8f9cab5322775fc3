"""Offline metrics (``evaluate.load`` needs the Hub) and the run history plots."""

from .classification import accuracy_metrics
from .generation import GenerationEvalCallback, first_word_accuracy, generate_answers
from .history import plot_history, write_json_atomic

__all__ = ["GenerationEvalCallback", "accuracy_metrics", "first_word_accuracy", "generate_answers", "plot_history",
           "write_json_atomic"]
