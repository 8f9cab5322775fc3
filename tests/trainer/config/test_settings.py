"""Every TrainingArguments field is honoured in the round loop, refused with the fix, or listed as having no effect
(fedhf/trainer/config/settings.py, and docs/trainer_settings.md generated from it); the round-counted ones work."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch
from safetensors.torch import load_file
from transformers import EarlyStoppingCallback, TrainerCallback, TrainingArguments

from fedhf.trainer.config.settings import HONOURED, NO_EFFECT, REFUSED, SETTINGS

from tests.helpers import config, digit_trainer, tiny_resnet, trainable_state
from tests.trainer.config.settings_table import DOC, render

PAGE = DOC  # docs/trainer_settings.md, the page that holds the table (it was the README's)


def test_every_training_arguments_field_is_in_the_table():
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert sorted(names - set(SETTINGS)) == []  # a new transformers field must be decided
    assert sorted(set(SETTINGS) - names) == []
    assert all(status in (HONOURED, REFUSED, NO_EFFECT) for status, _ in SETTINGS.values())
    assert all(text for _, text in SETTINGS.values())


def test_readme_table_lists_every_decided_field():
    text = PAGE.read_text()
    for name, (status, meaning) in SETTINGS.items():
        assert f"| `{name}` | {status} | {meaning} |" in text, name


def test_docs_trainer_settings_is_generated_from_the_table():
    order = [f.name for f in dataclasses.fields(TrainingArguments)]
    assert PAGE.read_text() == render(SETTINGS, order), \
        "docs/trainer_settings.md is stale: regenerate it with `python -m tests.trainer.config.settings_table`"


BAD_VALUES = {
    "num_train_epochs": 5, "max_steps": 100, "lr_scheduler_kwargs": {"num_cycles": 2}, "warmup_steps": 10,
    "optim_args": "momentum=0.9", "adam_beta1": 0.8, "adam_beta2": 0.99, "adam_epsilon": 1e-6,
    "optim_target_modules": ["attn"],
    "torch_empty_cache_steps": 5, "auto_find_batch_size": True, "include_num_input_tokens_seen": "all",
    "save_only_model": True, "enable_jit_checkpoint": True, "restore_callback_states_from_checkpoint": True,
    "data_seed": 3, "parallelism_config": {"tp_size": 2}, "train_sampling_strategy": "sequential",
    "deepspeed": "ds.json",
    "lr_scheduler_type": "cosine", "optim": "adafactor",
}


def test_every_refused_field_has_a_bad_value_tested():
    assert sorted(BAD_VALUES) == sorted(n for n, (s, _) in SETTINGS.items() if s == REFUSED)


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_refused_field_names_itself_and_the_fix(tmp_path, name):
    fix = SETTINGS[name][1]
    with pytest.raises(ValueError, match=re.escape(f"`{name}`=") + ".*" + re.escape(fix)):
        config(tmp_path, **{name: BAD_VALUES[name]})
    assert not (tmp_path / "run").exists()


def test_refused_fields_at_their_defaults_are_accepted(tmp_path):
    args = config(tmp_path)
    assert args.max_steps == -1 and args.data_seed is None


class _Recorder(TrainerCallback):
    """The rounds at which the loop logged / evaluated, and the trainable tensors after each evaluation."""

    def __init__(self):
        self.logged, self.evaluated, self.states = [], [], {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "train_loss" in (logs or {}) and "round" in logs:
            self.logged.append(state.global_step)

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        self.evaluated.append(state.global_step)
        self.states[state.global_step] = trainable_state(model)


def _run(digits, tmp_path, rounds=4, callbacks=(), **kw):
    base = dict(num_clients=2, clients_per_round=2, num_rounds=rounds, local_steps=1, partition="iid",
                local_optimizer="sgd", learning_rate=0.05)
    recorder = _Recorder()
    model = tiny_resnet()
    trainer = digit_trainer(model, digits, config(tmp_path, **{**base, **kw}), callbacks=[recorder, *callbacks])
    trainer.train()
    return trainer, recorder, model


def test_early_stopping_callback_stops_the_run(digits, tmp_path):
    # A learning rate too small to help: the accuracy soon fails to improve, and patience 1 stops there.
    trainer, recorder, _ = _run(digits, tmp_path, rounds=8, learning_rate=1e-12, eval_every_rounds=1,
                                metric_for_best_model="accuracy", callbacks=[EarlyStoppingCallback(1)])
    accuracy = [h["eval_accuracy"] for h in trainer.federated_history]
    first_without_gain = next(r for r in range(1, len(accuracy)) if accuracy[r] <= max(accuracy[:r]))
    assert len(accuracy) == first_without_gain + 1 < 8  # stopped at that round, before the planned 8
    assert recorder.evaluated == list(range(1, len(accuracy) + 1))
    assert trainer.state.best_metric == max(accuracy)


def test_load_best_model_at_end_loads_the_best_evaluated_round(digits, tmp_path):
    # greater_is_better on the loss picks the worst round as "best", so it is not the last one.
    trainer, recorder, model = _run(digits, tmp_path, rounds=3, eval_every_rounds=1, metric_for_best_model="loss",
                                    greater_is_better=True, load_best_model_at_end=True)
    losses = {h["round"]: h["eval_loss"] for h in trainer.federated_history}
    best = max(losses, key=losses.get)
    assert trainer.state.best_global_step == best and trainer.state.best_metric == losses[best]
    assert best != 3
    final = trainable_state(model)
    assert all(torch.equal(final[n], recorder.states[best][n]) for n in final)
    assert any(not torch.equal(final[n], recorder.states[3][n]) for n in final)


def test_save_steps_are_rounds_and_save_total_limit_keeps_the_best(digits, tmp_path):
    trainer, _, _ = _run(digits, tmp_path, rounds=4, save_strategy="steps", save_steps=1, save_total_limit=2,
                         eval_every_rounds=1, metric_for_best_model="loss", greater_is_better=True)
    best = trainer.state.best_global_step
    kept = sorted(int(d.rsplit("-", 1)[1]) for d in os.listdir(tmp_path / "run") if d.startswith("checkpoint-"))
    assert kept == sorted({best, 3, 4})
    weights = load_file(str(tmp_path / "run" / f"checkpoint-{best}" / "model" / "model.safetensors"))
    assert weights  # the best round's model is still there


def test_save_strategy_steps_maps_onto_save_every_rounds(tmp_path):
    assert config(tmp_path, save_strategy="steps", save_steps=2).save_every_rounds == 2
    assert config(tmp_path, save_strategy="epoch").save_every_rounds == 1
    assert config(tmp_path, save_strategy="no").save_every_rounds == 0
    with pytest.raises(ValueError, match="save_strategy='best'.*load_best_model_at_end"):
        config(tmp_path, save_strategy="best")
    with pytest.raises(ValueError, match="`save_steps`=0.5.*save_every_rounds"):
        config(tmp_path, save_strategy="steps", save_steps=0.5)


def test_eval_steps_and_eval_delay_count_rounds(digits, tmp_path):
    _, every_two, _ = _run(digits, tmp_path / "a", rounds=5, eval_strategy="steps", eval_steps=2)
    assert every_two.evaluated == [2, 4, 5]  # and always after the last round
    _, delayed, _ = _run(digits, tmp_path / "b", rounds=4, eval_every_rounds=1, eval_delay=3)
    assert delayed.evaluated == [3, 4]


def test_logging_steps_count_rounds(digits, tmp_path):
    _, steps, _ = _run(digits, tmp_path / "a", rounds=5, logging_strategy="steps", logging_steps=2)
    assert steps.logged == [2, 4, 5]
    _, first, _ = _run(digits, tmp_path / "b", rounds=3, logging_strategy="steps", logging_steps=2,
                       logging_first_step=True)
    assert first.logged == [1, 2, 3]
    _, silent, _ = _run(digits, tmp_path / "c", rounds=2, logging_strategy="no")
    assert silent.logged == []
