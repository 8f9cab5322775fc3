"""Which way a metric improves: one table, read word by word, and a config that declares it or is refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fedhf.metrics.direction import base_name, greater_is_better, known_direction

from tests.helpers import config


def test_known_names_and_their_summaries():
    lower = ["eval_loss", "eval_mse", "rmse", "eval_mae", "wer", "cer", "eval_perplexity", "eval_error_rate",
             "personal_eval_loss_worst", "eval_personal_eval_mse_mean"]
    higher = ["eval_accuracy", "f1", "eval_macro_f1", "eval_rouge1", "eval_bleu", "matthews_correlation",
              "mean_token_accuracy", "personal_eval_accuracy_mean"]
    assert [known_direction(m) for m in lower] == [False] * len(lower)
    assert [known_direction(m) for m in higher] == [True] * len(higher)
    assert known_direction("eval_score") is None and known_direction("eval_f1_error") is None  # unknown, ambiguous
    assert base_name("eval_personal_eval_wer_std") == "wer"


def test_the_runs_greater_is_better_decides_its_own_metric_only():
    args = SimpleNamespace(metric_for_best_model="score", greater_is_better=False)
    assert greater_is_better("eval_score", args) is False and greater_is_better("score", args) is False
    assert greater_is_better("eval_accuracy", args) is True and greater_is_better("eval_other", args) is None


def test_a_config_takes_the_direction_from_the_table_or_refuses(tmp_path):
    # TrainingArguments alone would guess "higher is better" for eval_mse (not a loss)
    assert config(tmp_path, metric_for_best_model="eval_mse").greater_is_better is False
    assert config(tmp_path, metric_for_best_model="personal_eval_loss_mean").greater_is_better is False
    assert config(tmp_path, metric_for_best_model="accuracy").greater_is_better is True
    assert config(tmp_path, metric_for_best_model="score", greater_is_better=False).greater_is_better is False
    with pytest.raises(ValueError, match="'score' has no known direction: set `greater_is_better=True`"):
        config(tmp_path, metric_for_best_model="score")
