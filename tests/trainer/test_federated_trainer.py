"""FederatedTrainer behaviour: input checks before training, communication accounting from real tensors,
reproducibility, any torch optimizer, every named algorithm."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch
from transformers import AutoModelForSequenceClassification, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

import fedhf
from fedhf import FederatedTrainer

from tests.helpers import config, digit_trainer, lora_minilm, tiny_resnet, trainable_state, tweet_trainer


def _no_output(tmp_path):
    run = tmp_path / "run"
    return not run.exists() or not any(run.iterdir())


def test_more_clients_than_rows_is_refused_before_training(digits, tmp_path):
    small = {"train": digits["train"].select(range(5)), "test": digits["test"]}
    with pytest.raises(ValueError, match="num_clients.*more than the 5 training rows"):
        digit_trainer(tiny_resnet(), small, config(tmp_path, num_clients=6, clients_per_round=2, partition="iid"))
    assert _no_output(tmp_path)


def test_missing_label_column_is_refused(digits, tmp_path):
    with pytest.raises(ValueError, match="partition_column.*'user'.*not a column"):
        digit_trainer(tiny_resnet(), digits, config(tmp_path, partition_column="user"))
    assert _no_output(tmp_path)


def test_non_categorical_column_is_refused(digits, tmp_path):
    with pytest.raises(ValueError, match="partition_column.*not categorical.*class_encode_column"):
        digit_trainer(tiny_resnet(), digits, config(tmp_path, partition_column="pixel_values"))


def test_model_without_trainable_parameters_is_refused(minilm, tweets, tokenizer, tmp_path):
    model = AutoModelForSequenceClassification.from_pretrained(minilm, num_labels=3)
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters.*peft"):
        tweet_trainer(model, tweets, tokenizer, config(tmp_path))
    assert _no_output(tmp_path)


def test_trainer_needs_a_federated_config(tmp_path):
    from transformers import TrainingArguments

    with pytest.raises(TypeError, match="FederatedConfig"):
        FederatedTrainer(model=tiny_resnet(), args=TrainingArguments(output_dir=str(tmp_path), report_to="none"))


def test_communication_is_counted_from_the_tensors_sent(digits, tmp_path):
    model = tiny_resnet()
    n_params = sum(p.numel() for p in model.parameters())
    n_buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())
    unit = 4 * (n_params + n_buffers) / 2**20  # one fp32 copy of the federated state, in MB

    def run(algorithm, name):
        args = config(tmp_path / name, algorithm=algorithm, num_clients=5, clients_per_round=3, num_rounds=2,
                      local_steps=1)
        trainer = digit_trainer(tiny_resnet(), digits, args, evaluate=False)
        trainer.train()
        return trainer.federated_history[-1]

    fedavg, scaffold = run("fedavg", "a"), run("scaffold", "b")
    client_rounds = 2 * 3
    assert fedavg["uplink_MB"] == pytest.approx(client_rounds * unit)
    assert fedavg["downlink_MB"] == pytest.approx(client_rounds * unit)
    # SCAFFOLD also sends Delta_c up and receives c down: the parameter part doubles both ways
    extra = client_rounds * 4 * n_params / 2**20
    assert scaffold["uplink_MB"] == pytest.approx(fedavg["uplink_MB"] + extra)
    assert scaffold["downlink_MB"] == pytest.approx(fedavg["downlink_MB"] + extra)


def test_same_seed_same_model_other_seed_other_model(digits, tmp_path):
    def run(seed, name):
        model = tiny_resnet()
        args = config(tmp_path / name, seed=seed, num_clients=6, clients_per_round=3, num_rounds=2, local_steps=3)
        digit_trainer(model, digits, args, evaluate=False).train()
        return trainable_state(model)

    a, b, c = run(0, "a"), run(0, "b"), run(1, "c")
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.equal(a[n], c[n]) for n in a)


@pytest.mark.parametrize("optimizer", [torch.optim.RAdam, "Adagrad", "rmsprop"])
def test_any_torch_optimizer_is_a_local_optimizer(digits, tmp_path, optimizer):
    model = tiny_resnet()
    before = trainable_state(model)
    args = config(tmp_path, local_optimizer=optimizer, learning_rate=1e-2)
    trainer = digit_trainer(model, digits, args, evaluate=False)
    assert trainer.algorithm.local_optimizer.cls.__name__.lower() in {"radam", "adagrad", "rmsprop"}
    trainer.train()
    after = trainable_state(model)
    assert all(not torch.equal(before[n], after[n]) for n in before)


def _short_curvature_pass(name: str) -> dict:
    """FOOF's covariances default to a pass over all local data per round; 64 examples keep the tests short."""
    return {"curvature_samples": 64} if name in ("fedpm", "localnewton") else {}


@pytest.mark.parametrize("name", fedhf.list_algorithms())
def test_every_named_algorithm_trains_full_weights(digits, tmp_path, name):
    model = tiny_resnet()
    args = config(tmp_path, algorithm=name, algorithm_kwargs=_short_curvature_pass(name), num_clients=4,
                  clients_per_round=2, num_rounds=2, local_steps=3)
    trainer = digit_trainer(model, digits, args, evaluate=False)
    before = trainable_state(model)
    output = trainer.train()
    assert output.global_step == 2 and torch.isfinite(torch.tensor(output.training_loss))
    assert any(not torch.equal(before[n], p) for n, p in trainable_state(model).items())


@pytest.mark.parametrize("name", fedhf.list_algorithms())
def test_every_named_algorithm_trains_lora(minilm, tweets, tokenizer, tmp_path, name):
    # One pretrained layer is a third of the time. prefed's first preconditioned steps leave layer 0's query lora_A
    # exactly where it was on that model within these 4 local steps, so prefed keeps the whole MiniLM.
    model = lora_minilm(minilm, layers=None if name == "prefed" else 1)
    before = trainable_state(model)
    args = config(tmp_path, algorithm=name, algorithm_kwargs=_short_curvature_pass(name), num_clients=4,
                  clients_per_round=2, num_rounds=2, local_steps=2, per_device_train_batch_size=8)
    tweet_trainer(model, tweets, tokenizer, args, evaluate=False).train()
    after = trainable_state(model)
    assert all(not torch.equal(before[n], after[n]) for n in before)


def test_save_every_rounds_writes_complete_checkpoints_with_the_adapter(minilm, tweets, tokenizer, tmp_path):
    args = config(tmp_path, num_rounds=3, local_steps=1, save_every_rounds=2, per_device_train_batch_size=4)
    tweet_trainer(lora_minilm(minilm), tweets, tokenizer, args, evaluate=False).train()
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"]
    files = {p.relative_to(run / "checkpoint-2").as_posix() for p in (run / "checkpoint-2").rglob("*")}
    assert {"manifest.json", "meta.json", "global_params.safetensors", "model/adapter_model.safetensors"} <= files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl"))]  # no pickles
    assert not list(run.glob("*.tmp"))


def test_model_card_says_how_the_model_was_trained(digits, tmp_path):
    args = config(tmp_path, algorithm="scaffold", num_rounds=1, local_steps=1)
    trainer = digit_trainer(tiny_resnet(), digits, args)
    trainer.train()
    trainer.create_model_card()
    card = (tmp_path / "run" / "README.md").read_text()
    assert "federated-learning" in card and "## Federated training (fedhf)" in card
    assert "**scaffold**" in card and "| clients (N) | 4 |" in card and "final eval_accuracy" in card


class _PoisonedClient(FederatedTrainer):
    """Client 1 produces a NaN loss every round (a broken device, an overflow)."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        return loss * float("nan") if self._current_client == 1 else loss

    def _begin_client(self, ctx, access=None):
        self._current_client = ctx.client_id
        return super()._begin_client(ctx, access)


def test_a_client_that_returns_nan_is_excluded_and_the_run_completes(digits, tmp_path):
    args = config(tmp_path, num_clients=3, clients_per_round=3, num_rounds=2, local_steps=2)
    model = tiny_resnet()
    trainer = _PoisonedClient(model=model, args=args, train_dataset=digits["train"])
    trainer.train()
    assert [h["excluded_clients"] for h in trainer.federated_history] == [1, 1]
    assert [h["participants"] for h in trainer.federated_history] == [2, 2]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_update_norm_bound_excludes_everyone_and_leaves_the_model_unchanged(digits, tmp_path):
    args = config(tmp_path, num_clients=3, clients_per_round=3, num_rounds=1, local_steps=2, max_update_norm=1e-9)
    model = tiny_resnet()
    before = trainable_state(model)
    trainer = digit_trainer(model, digits, args, evaluate=False)
    trainer.train()
    assert trainer.federated_history[-1]["excluded_clients"] == 3
    assert all(torch.equal(before[n], p) for n, p in trainable_state(model).items())


class _AdversarialClient(FederatedTrainer):
    """Client 0 sends a huge update every round (a model-poisoning attack)."""

    def _faulty(self, loss_sum, delta):
        if self._current_client == 0:
            for d in delta.values():
                d.fill_(1e4)
        return super()._faulty(loss_sum, delta)

    def _begin_client(self, ctx, access=None):
        self._current_client = ctx.client_id
        return super()._begin_client(ctx, access)


@pytest.mark.parametrize("rule, bounded", [("mean", False), ("median", True), ("trimmed_mean", True)])
def test_robust_server_rules_resist_a_poisoning_client_end_to_end(digits, tmp_path, rule, bounded):
    model = tiny_resnet()
    args = config(tmp_path, num_clients=5, clients_per_round=5, num_rounds=1, local_steps=2, server_rule=rule,
                  server_rule_kwargs={"trim_fraction": 0.2} if rule == "trimmed_mean" else None)
    _AdversarialClient(model=model, args=args, train_dataset=digits["train"]).train()
    largest = max(p.detach().abs().max().item() for p in model.parameters())
    assert (largest < 100) == bounded


def test_an_earlier_run_is_not_overwritten_silently(digits, tmp_path):
    args = config(tmp_path, num_rounds=2, local_steps=1, save_every_rounds=1)
    digit_trainer(tiny_resnet(), digits, args, evaluate=False).train()
    history = (tmp_path / "run" / "federated_history.json").read_text()
    with pytest.raises(ValueError, match="earlier federated run.*checkpoint-2.*resume_from_checkpoint=True.*--resume"
                                         ".*overwrite_output_dir"):
        digit_trainer(tiny_resnet(), digits, args, evaluate=False).train()
    assert (tmp_path / "run" / "federated_history.json").read_text() == history
    assert sorted(os.listdir(tmp_path / "run")).count("checkpoint-2") == 1
    # overwriting replaces the earlier run's checkpoints too, so a later resume cannot pick its checkpoint-2
    again = config(tmp_path, num_rounds=1, local_steps=1, overwrite_output_dir=True)
    digit_trainer(tiny_resnet(), digits, again, evaluate=False).train()
    assert not [name for name in os.listdir(tmp_path / "run") if name.startswith("checkpoint-")]
    # an earlier run with no checkpoint is not offered a resume
    with pytest.raises(ValueError, match="It wrote no checkpoint to resume from. Choose another `output_dir`"):
        digit_trainer(tiny_resnet(), digits, config(tmp_path, num_rounds=1, local_steps=1), evaluate=False).train()


class _StopAfterRound1(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = True


def test_an_earlier_fedhf_runs_checkpoint_round_n_folders_still_resume_and_rotate(digits, tmp_path):
    """Round checkpoints are now named as Trainer names them (checkpoint-N); a run saved under the older
    checkpoint-round-N name resumes to the uninterrupted result, and save_total_limit rotates its folders too."""
    full = tiny_resnet()
    digit_trainer(full, digits, config(tmp_path / "full", num_rounds=2, local_steps=1), evaluate=False).train()
    cut = config(tmp_path / "cut", num_rounds=2, local_steps=1, save_every_rounds=1)
    digit_trainer(tiny_resnet(), digits, cut, evaluate=False, callbacks=[_StopAfterRound1()]).train()
    run = tmp_path / "cut" / "run"
    os.rename(run / f"{PREFIX_CHECKPOINT_DIR}-1", run / "checkpoint-round-1")  # as an earlier fedhf wrote it
    resumed = tiny_resnet()
    again = config(tmp_path / "cut", num_rounds=2, local_steps=1, save_every_rounds=1, save_total_limit=1)
    trainer = digit_trainer(resumed, digits, again, evaluate=False)
    trainer.train(resume_from_checkpoint=True)
    assert [h["round"] for h in trainer.federated_history] == [1, 2]
    final_full, final_resumed = trainable_state(full), trainable_state(resumed)
    assert all(torch.equal(final_full[n], final_resumed[n]) for n in final_full)
    assert sorted(name for name in os.listdir(run) if name.startswith("checkpoint")) == [f"{PREFIX_CHECKPOINT_DIR}-2"]


def test_dataloader_drop_last_lets_batchnorm_clients_skip_a_one_row_batch(digits, tmp_path):
    """A client of 17 rows with batch 16 ends each pass on a 1-row batch, on which BatchNorm cannot train."""
    parts = [list(range(17)), list(range(17, 40))]
    args = config(tmp_path / "crash", num_clients=2, clients_per_round=2, num_rounds=1, local_steps=2)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        digit_trainer(tiny_resnet(), digits, args, evaluate=False, client_partitions=parts).train()
    args = config(tmp_path / "ok", num_clients=2, clients_per_round=2, num_rounds=1, local_steps=2,
                  dataloader_drop_last=True)
    digit_trainer(tiny_resnet(), digits, args, evaluate=False, client_partitions=parts).train()


@pytest.mark.parametrize("bound", [-1.0, 0.0])
def test_max_grad_norm_at_or_below_zero_means_no_clipping(digits, tmp_path, bound):
    """Trainer's meaning; clip_grad_norm_ with a negative bound would flip every gradient (gradient ascent)."""
    def run(norm, name):
        model = tiny_resnet()
        args = config(tmp_path / name, num_clients=2, clients_per_round=2, num_rounds=1, local_steps=2,
                      partition="iid", local_optimizer="sgd", learning_rate=0.05, max_grad_norm=norm)
        digit_trainer(model, digits, args, evaluate=False).train()
        return trainable_state(model)

    unclipped, huge_bound, tiny_bound = run(bound, "a"), run(1e30, "b"), run(1e-6, "c")
    assert all(torch.equal(unclipped[n], huge_bound[n]) for n in unclipped)
    assert any(not torch.equal(unclipped[n], tiny_bound[n]) for n in unclipped)  # clipping does act when > 0


class _Events(TrainerCallback):
    """Counts the events; asks for a checkpoint and an evaluation after round ``ask_at`` (None: never)."""

    def __init__(self, ask_at=None) -> None:
        self.counts, self.ask_at, self.best_at_save = Counter(), ask_at, []

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.counts["epoch_begin"] += 1

    def on_epoch_end(self, args, state, control, **kwargs):
        self.counts["epoch_end"] += 1

    def on_step_begin(self, args, state, control, **kwargs):
        self.counts["step_begin"] += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.counts["step_end"] += 1
        if state.global_step == self.ask_at:
            control.should_save = control.should_evaluate = True

    def on_evaluate(self, args, state, control, **kwargs):
        self.counts["evaluate"] += 1

    def on_save(self, args, state, control, **kwargs):
        self.counts["save"] += 1
        self.best_at_save.append(state.best_model_checkpoint)
        # the path transformers' reporting integrations (W&B, MLflow, ClearML, DVCLive) upload at on_save
        assert os.path.isfile(os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}",
                                           "manifest.json"))


def test_callbacks_see_rounds_as_steps_and_epochs_and_every_checkpoint(digits, tmp_path):
    events = _Events()
    args = config(tmp_path, num_rounds=2, local_steps=1, save_every_rounds=1, eval_every_rounds=1,
                  metric_for_best_model="accuracy")
    trainer = digit_trainer(tiny_resnet(), digits, args, callbacks=[events])
    trainer.train()
    assert events.counts == {"epoch_begin": 2, "step_begin": 2, "step_end": 2, "epoch_end": 2, "evaluate": 2,
                             "save": 2}
    best = os.path.join(args.output_dir, f"checkpoint-{trainer.state.best_global_step}")
    assert events.best_at_save[-1] == trainer.state.best_model_checkpoint == best
    assert events.best_at_save[0] == os.path.join(args.output_dir, "checkpoint-1")  # round 1 is the first best


def test_a_checkpoint_and_evaluation_a_callback_asks_for_are_made(digits, tmp_path):
    events = _Events(ask_at=1)
    args = config(tmp_path, num_rounds=2, local_steps=1)  # no save_every_rounds; evaluated after the last round only
    trainer = digit_trainer(tiny_resnet(), digits, args, callbacks=[events])
    trainer.train()
    assert sorted(name for name in os.listdir(args.output_dir) if name.startswith("checkpoint")) == [
        "checkpoint-1"]
    assert events.counts["save"] == 1 and events.counts["evaluate"] == 2
    assert [("eval_accuracy" in h) for h in trainer.federated_history] == [True, True]


class _Dtypes(TrainerCallback):
    """The LoRA dtype and ``is_in_train`` at the start of every round."""

    def __init__(self, trainer_box: list) -> None:
        self.box, self.seen = trainer_box, []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        dtype = next(p.dtype for n, p in model.named_parameters() if "lora_A" in n)
        self.seen.append((dtype, self.box[0].is_in_train))


def test_in_training_evaluations_leave_the_model_in_its_dtype(tmp_path, monkeypatch):
    """``is_in_train`` is True while train() runs (so Trainer's evaluation loop does not cast the resident model
    for ``bf16_full_eval``) and False after it, an exception included. Before, the first evaluation turned the
    LoRA weights bf16 and every later round trained in pure bf16. The model goes to the device at __init__ (Trainer
    defers that to its train() under a full-precision eval; it stayed off the GPU)."""
    from fedhf.data.sft import SFTCollator

    from tests.helpers import IdsOnly, answer_rows, tiny_llama_lora

    moved = []
    placed = FederatedTrainer._move_model_to_device
    monkeypatch.setattr(FederatedTrainer, "_move_model_to_device",
                        lambda self, model, device: moved.append(device) or placed(self, model, device))
    box: list = []
    watch = _Dtypes(box)
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=3, local_steps=1, partition="iid",
                  per_device_train_batch_size=4, per_device_eval_batch_size=8, eval_every_rounds=1,
                  bf16_full_eval=True, learning_rate=0.05)
    trainer = FederatedTrainer(model=tiny_llama_lora(100), args=args, train_dataset=answer_rows(16),
                               eval_dataset=answer_rows(8, seed=1), data_collator=SFTCollator(IdsOnly()),
                               callbacks=[watch])
    box.append(trainer)
    assert moved == [args.device]
    trainer.train()
    assert watch.seen == [(torch.float32, True)] * 3
    assert trainer.is_in_train is False

    class Fail(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            raise RuntimeError("stop here")

    trainer.add_callback(Fail())
    args.overwrite_output_dir = True
    with pytest.raises(RuntimeError, match="stop here"):
        trainer.train()
    assert trainer.is_in_train is False
