"""Metrics that callbacks add during ``evaluate()`` reach the log too.

Trainer's ``evaluate()`` logs its metrics and only then calls the callbacks' ``on_evaluate``; metrics a callback
adds there (``GenerationEvalCallback``'s ``eval_perplexity`` and ``eval_generation_accuracy``) reach the returned
dict, and so the federated history and the plot, but never the console or ``report_to``. This base logs them in
a second record right after, so the console, ``report_to`` and the history agree. A base of FederatedTrainer
before ``Trainer``, so ``super()`` reaches Trainer's (or trl's) ``log`` and ``evaluate``."""

from __future__ import annotations

from typing import Optional, Set


class LateMetricsLog:
    _logged_during_eval: Optional[Set[str]] = None  # the keys logged by the evaluation in progress

    def log(self, logs: dict, *args, **kwargs) -> None:
        result = super().log(logs, *args, **kwargs)
        if self._logged_during_eval is not None:
            self._logged_during_eval.update(logs)  # after Trainer (and trl) added their keys to it
        return result

    def evaluate(self, *args, **kwargs) -> dict:
        self._logged_during_eval = set()
        try:
            metrics = super().evaluate(*args, **kwargs)
        finally:
            logged, self._logged_during_eval = self._logged_during_eval, None
        late = {k: v for k, v in metrics.items() if k not in logged}
        if late:
            self.log(dict(late))
        return metrics
