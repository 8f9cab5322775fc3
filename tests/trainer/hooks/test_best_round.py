"""The best round survives a resume: ``load_best_model_at_end`` and ``save_total_limit`` end an interrupted and
resumed run exactly as an uninterrupted one (the same model, best_* fields and kept checkpoints)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import TrainerCallback

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.data.sft import SFTCollator

from tests.helpers import tiny_llama_lora, trainable_state, tweet_sft, without_timings


class StopAfter(TrainerCallback):
    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.rounds


@pytest.fixture(scope="module")
def sft(tokenizer):
    return tweet_sft(tokenizer, n_train=48, n_test=8, max_length=24)


def _run(tokenizer, sft, out, resume=False, stop=None):
    # greater_is_better on eval_loss: the loss falls, so the "best" round is the first, long before the last, and a
    # run that forgot it would pick a later round and let save_total_limit delete round 1's checkpoint.
    args = FederatedConfig(output_dir=str(out), report_to="none", disable_tqdm=True, logging_strategy="no", seed=0,
                           num_clients=2, num_rounds=3, local_steps=1, per_device_train_batch_size=4, use_cpu=True,
                           eval_every_rounds=1, partition="iid", learning_rate=0.05, save_every_rounds=1,
                           save_total_limit=1, load_best_model_at_end=True, metric_for_best_model="eval_loss",
                           greater_is_better=True, partition_report=False)
    trainer = FederatedTrainer(model=tiny_llama_lora(len(tokenizer)), args=args, train_dataset=sft["train"],
                               eval_dataset=sft["test"], data_collator=SFTCollator(tokenizer),
                               callbacks=[StopAfter(stop)] if stop else None)
    trainer.train(resume_from_checkpoint=resume or None)
    return trainer


def _kept(out):
    return sorted(name for name in os.listdir(out) if name.startswith("checkpoint-"))


def test_a_resumed_run_keeps_the_best_round(tokenizer, sft, tmp_path):
    full = _run(tokenizer, sft, tmp_path / "full")
    _run(tokenizer, sft, tmp_path / "cut", stop=2)
    assert _kept(tmp_path / "cut") == ["checkpoint-1", "checkpoint-2"]
    resumed = _run(tokenizer, sft, tmp_path / "cut", resume=True)

    assert full.state.best_global_step == 1  # the setting the test relies on
    assert resumed.state.best_global_step == full.state.best_global_step
    assert resumed.state.best_metric == full.state.best_metric
    assert os.path.basename(resumed.state.best_model_checkpoint) == os.path.basename(full.state.best_model_checkpoint)
    assert _kept(tmp_path / "cut") == _kept(tmp_path / "full") == ["checkpoint-1", "checkpoint-3"]
    final_full, final_resumed = trainable_state(full.model), trainable_state(resumed.model)
    assert all(torch.equal(final_full[n], final_resumed[n]) for n in final_full)
    assert [h["round"] for h in resumed.federated_history] == [1, 2, 3]


def _synthetic_run(out, callbacks=(), **overrides):
    from tests.helpers import IdsOnly, answer_rows

    base = dict(output_dir=str(out), report_to="none", disable_tqdm=True, logging_strategy="no", seed=0,
                num_clients=2, num_rounds=3, local_steps=2, per_device_train_batch_size=4,
                per_device_eval_batch_size=16, use_cpu=True, eval_every_rounds=1, partition="iid",
                learning_rate=0.05, partition_report=False, save_strategy="no")
    eval_dataset = overrides.pop("eval_dataset", answer_rows(16, seed=1))
    base.update(overrides)
    return FederatedTrainer(model=tiny_llama_lora(100), args=FederatedConfig(**base), train_dataset=answer_rows(32),
                            eval_dataset=eval_dataset, data_collator=SFTCollator(IdsOnly()), callbacks=list(callbacks))


class KeepEvaluated(TrainerCallback):
    """The trainable tensors at every evaluation."""

    def __init__(self) -> None:
        self.models = {}

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        self.models[state.global_step] = trainable_state(model)


def test_a_nan_first_metric_is_never_the_best_round(tmp_path):
    """Trainer starts from -inf: a metric undefined at the first evaluation (NaN) is never best, and the model
    loaded at the end is the best finite round's. It was round 1 (NaN) for the whole run."""
    calls = []

    def metrics(prediction):  # undefined at the first evaluation, then best at the second
        calls.append(prediction.predictions.shape[0])
        return {"accuracy": {1: float("nan"), 2: 0.75}.get(len(calls), 0.5)}

    keep = KeepEvaluated()
    trainer = _synthetic_run(tmp_path, [keep], metric_for_best_model="accuracy", load_best_model_at_end=True)
    trainer.compute_metrics = metrics
    trainer.train()
    scores = {h["round"]: h["eval_accuracy"] for h in trainer.federated_history}
    assert scores[1] != scores[1] and scores[2] == 0.75 and scores[3] == 0.5
    assert trainer.state.best_global_step == 2 and trainer.state.best_metric == 0.75
    final = trainable_state(trainer.model)
    assert all(torch.equal(final[n], keep.models[2][n]) for n in final)  # round 2's model, not the last one


def test_a_personalised_metric_picks_the_best_round(tmp_path):
    """``metric_for_best_model`` naming a personal_eval_* metric: recorded after the personalised evaluation (it
    raised KeyError after round 1 had trained); its direction is the table's (a loss: lower); no global
    ``eval_dataset`` is needed for it."""
    trainer = _synthetic_run(tmp_path, metric_for_best_model="personal_eval_loss_mean", personalized_eval=True,
                             client_eval_fraction=0.25, num_rounds=2, eval_dataset=None)
    assert trainer.args.greater_is_better is False
    trainer.train()
    values = {h["round"]: h["personal_eval_loss_mean"] for h in trainer.federated_history}
    assert trainer.state.best_global_step == min(values, key=values.get)
    assert trainer.state.best_metric == min(values.values())


class ExcludesRounds2And3(FederatedTrainer):
    """Every client of rounds 2 and 3 excluded (``_faulty`` is the trainer's documented per-client check)."""

    def _faulty(self, loss_sum, delta):
        return "excluded by the test" if self.state.global_step in (1, 2) else super()._faulty(loss_sum, delta)


def _resumable(out, resume=False):
    from tests.helpers import IdsOnly, answer_rows

    args = FederatedConfig(output_dir=str(out), report_to="none", disable_tqdm=True, logging_strategy="no", seed=0,
                           num_clients=2, num_rounds=4, local_steps=1, per_device_train_batch_size=4, use_cpu=True,
                           per_device_eval_batch_size=16, eval_every_rounds=1, partition="iid", learning_rate=0.05,
                           partition_report=False, save_every_rounds=1, max_excluded_rounds=3,
                           load_best_model_at_end=True, metric_for_best_model="eval_loss", personalized_eval=True,
                           client_eval_fraction=0.25)
    trainer = ExcludesRounds2And3(model=tiny_llama_lora(100), args=args, train_dataset=answer_rows(32),
                                  eval_dataset=answer_rows(8, seed=1), data_collator=SFTCollator(IdsOnly()))
    trainer.train(resume_from_checkpoint=resume or None)
    return trainer


def _history(trainer) -> str:
    """The history without its timings, as JSON (a NaN train loss equals itself there)."""
    import json

    return json.dumps(without_timings(trainer.federated_history), sort_keys=True)


def test_a_run_killed_and_resumed_at_any_round_ends_as_the_uninterrupted_one(tmp_path):
    """A 4-round run with the exclusion guard (rounds 2 and 3 excluded), the best round loaded at the end and
    personalised evaluation, killed after round k (its folder holds what the run wrote up to checkpoint-k) and
    resumed, for every k: the same history, best round, model and exclusion streak as without the interruption."""
    import shutil

    from fedhf.state import load_checkpoint

    full = _resumable(tmp_path / "full")
    assert [h["participants"] for h in full.federated_history] == [2, 0, 0, 2]  # the setting the test relies on
    for k in (1, 2, 3):
        checkpoint = tmp_path / "full" / f"checkpoint-{k}"
        assert load_checkpoint(str(checkpoint), "cpu")[1]["hooks"]["per_hook"]["ExclusionStop"]["excluded_streak"] == [0, 1, 2][k - 1]
        shutil.copytree(checkpoint, tmp_path / f"cut{k}" / f"checkpoint-{k}")  # the run killed after round k
        resumed = _resumable(tmp_path / f"cut{k}", resume=True)
        assert _history(resumed) == _history(full), k
        assert (resumed.state.best_global_step, resumed.state.best_metric) == \
               (full.state.best_global_step, full.state.best_metric), k
        final_full, final_resumed = trainable_state(full.model), trainable_state(resumed.model)
        assert all(torch.equal(final_full[n], final_resumed[n]) for n in final_full), k


def test_the_exclusion_streak_survives_a_resume(tmp_path):
    """Every client excluded every round, max_excluded_rounds=3: the run stopped after round 2 and resumed stops
    at round 3 as the uninterrupted one does (the streak restarted at 0 and it finished 4 unchanged rounds)."""
    from fedhf.trainer.hooks.guards import AllExcludedError

    from tests.helpers import IdsOnly, answer_rows

    def run(out, stop=None, resume=False):
        args = FederatedConfig(output_dir=str(out), report_to="none", disable_tqdm=True, logging_strategy="no",
                               num_clients=2, num_rounds=4, local_steps=1, per_device_train_batch_size=4,
                               use_cpu=True, partition="iid", partition_report=False, save_every_rounds=1,
                               max_update_norm=1e-12, max_excluded_rounds=3)
        trainer = FederatedTrainer(model=tiny_llama_lora(100), args=args, train_dataset=answer_rows(16),
                                   data_collator=SFTCollator(IdsOnly()), callbacks=[StopAfter(stop)] if stop else None)
        trainer.train(resume_from_checkpoint=resume or None)
        return trainer

    run(tmp_path, stop=2)
    with pytest.raises(AllExcludedError, match=r"3 consecutive rounds \(up to round 3"):
        run(tmp_path, resume=True)
