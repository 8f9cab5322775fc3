"""The best round survives a resume: ``load_best_model_at_end`` and ``save_total_limit`` end an interrupted and
resumed run exactly as an uninterrupted one (the same model, best_* fields and kept checkpoints)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import TrainerCallback

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.data.sft import SFTCollator

from tests.helpers import tiny_llama_lora, trainable_state, tweet_sft


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
