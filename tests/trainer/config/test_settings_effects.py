"""Every TrainingArguments field marked honoured (fedhf/trainer/config/settings.py) is set by at least one test, and the
honoured fields no other test set have their effect asserted here: Trainer's own evaluation settings reaching
``evaluate()`` inside a FederatedTrainer, the data settings reaching each client's loader, the checkpointing
keywords reaching the model, the Hub settings reaching the Hub calls, and what the CPU-only ones do on a CPU."""

from __future__ import annotations

import logging
import os
import pathlib
import re

import huggingface_hub
import pytest
import torch
import transformers
from transformers import default_data_collator
from transformers.trainer_pt_utils import EvalLoopContainer

from fedhf import FederatedTrainer
from fedhf.trainer.config.settings import HONOURED, SETTINGS

from tests.helpers import config, digit_trainer, tiny_llama_lora, tiny_resnet

TESTS = pathlib.Path(__file__).resolve().parents[2]

# Honoured fields whose effect needs several processes (torchrun) or a logging integration not installed here;
# each stays listed only while no test sets it (the scan below fails when one is set: then drop it from here).
NEEDS_PROCESSES_OR_INTEGRATIONS = {
    "local_rank": "set by the launcher",
    "log_level_replica": "the log level of processes other than the main one",
    "log_on_each_node": "which processes log on a multi-node run",
    "eval_use_gather_object": "how evaluation gathers across processes",
    "run_name": "a logging integration's run name",
    "project": "trackio's project",
    "trackio_space_id": "trackio",
    "trackio_bucket_id": "trackio",
    "trackio_static_space_id": "trackio",
}


def _sets(field: str, source: str) -> bool:
    """A keyword argument ``field=`` or a config-dict key ``"field":`` in the tests' source."""
    return re.search(rf"\b{field}\s*=[^=]|[\"']{field}[\"']\s*:", source) is not None


def test_every_honoured_field_is_set_by_a_test():
    own = pathlib.Path(__file__).read_text()
    start = own.index("NEEDS_PROCESSES_OR_INTEGRATIONS = {")
    own = own[:start] + own[own.index("\n}\n", start):]  # the list itself sets nothing
    source = own + "\n".join(p.read_text() for p in TESTS.rglob("*.py") if p.name != pathlib.Path(__file__).name)
    honoured = sorted(n for n, (status, _) in SETTINGS.items() if status == HONOURED)
    unset = [n for n in honoured if not _sets(n, source)]
    assert sorted(unset) == sorted(NEEDS_PROCESSES_OR_INTEGRATIONS)
    assert set(NEEDS_PROCESSES_OR_INTEGRATIONS) <= set(honoured)


def _digits_trainer(digits, tmp_path, compute_metrics=None, **kw):
    from fedhf.metrics import accuracy_metrics

    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=1, local_steps=1, partition="iid",
                  per_device_eval_batch_size=64, **kw)
    return FederatedTrainer(model=tiny_resnet(), args=args, train_dataset=digits["train"],
                            eval_dataset=digits["test"].select(range(150)),
                            compute_metrics=compute_metrics or accuracy_metrics)


def test_prediction_loss_only_skips_compute_metrics(digits, tmp_path):
    assert "eval_accuracy" in _digits_trainer(digits, tmp_path / "a").evaluate()
    metrics = _digits_trainer(digits, tmp_path / "b", prediction_loss_only=True).evaluate()
    assert "eval_loss" in metrics and "eval_accuracy" not in metrics


def test_include_for_metrics_and_eval_do_concat_batches_shape_what_compute_metrics_gets(digits, tmp_path):
    seen = {}

    def record(prediction):
        seen["inputs"], seen["predictions"] = prediction.inputs, prediction.predictions
        return {"rows": 1.0}

    _digits_trainer(digits, tmp_path / "a", compute_metrics=record).evaluate()
    assert seen["inputs"] is None and seen["predictions"].shape == (150, 10)
    _digits_trainer(digits, tmp_path / "b", compute_metrics=record, include_for_metrics=["inputs"],
                    eval_do_concat_batches=False).evaluate()
    assert [len(p) for p in seen["predictions"]] == [64, 64, 22]  # one array per batch, not concatenated
    assert sum(len(x) for x in seen["inputs"]) == 150 and seen["inputs"][0].shape[1:] == (1, 8, 8)


def test_batch_eval_metrics_calls_compute_metrics_per_batch(digits, tmp_path):
    calls = []

    def per_batch(prediction, compute_result: bool):
        calls.append((len(prediction.predictions), compute_result))
        return {"rows": float(len(prediction.predictions))}

    _digits_trainer(digits, tmp_path, compute_metrics=per_batch, batch_eval_metrics=True).evaluate()
    assert calls == [(64, False), (64, False), (22, True)]


def test_eval_accumulation_steps_moves_predictions_off_the_device_every_n_steps(digits, tmp_path, monkeypatch):
    moves = []
    original = EvalLoopContainer.to_cpu_and_numpy
    monkeypatch.setattr(EvalLoopContainer, "to_cpu_and_numpy", lambda self: moves.append(1) or original(self))
    baseline = _digits_trainer(digits, tmp_path / "a").evaluate()
    without = len(moves)
    accumulated = _digits_trainer(digits, tmp_path / "b", eval_accumulation_steps=1).evaluate()
    assert len(moves) - without > without  # after each of the 3 batches, not only at the end
    assert accumulated["eval_accuracy"] == baseline["eval_accuracy"]


@pytest.mark.filterwarnings("ignore::UserWarning")  # bf16 emulated on a CPU without bf16 units
def test_bf16_full_eval_evaluates_in_bf16(tmp_path, tokenizer):
    from fedhf.data.sft import SFTCollator

    from tests.helpers import tweet_sft

    data = tweet_sft(tokenizer, n_train=8, n_test=16, max_length=32)

    def trainer(path, **kw):
        args = config(path, num_clients=2, clients_per_round=2, partition="iid", **kw)
        return FederatedTrainer(model=tiny_llama_lora(len(tokenizer)), args=args, train_dataset=data["train"],
                                eval_dataset=data["test"], data_collator=SFTCollator(tokenizer))

    loss32 = trainer(tmp_path / "a").evaluate()["eval_loss"]
    half = trainer(tmp_path / "b", bf16_full_eval=True)
    loss16 = half.evaluate()["eval_loss"]
    assert next(half.model.parameters()).dtype == torch.bfloat16  # Trainer casts the model for evaluation
    assert loss16 != loss32 and loss16 == pytest.approx(loss32, rel=0.05)


@pytest.mark.parametrize("setting", [{"fp16": True}, {"fp16_full_eval": True}])
def test_fp16_is_refused_on_the_cpu_naming_bf16(tmp_path, setting):
    field = next(iter(setting))
    with pytest.raises(ValueError, match=f"`{field}=True` needs a GPU.*{field}=False.*bf16=True"):
        config(tmp_path, **setting)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what tf32 does without a tf32 GPU")
def test_tf32_is_refused_by_training_arguments_without_a_tf32_gpu(tmp_path):
    with pytest.raises(ValueError, match="tf32"):
        config(tmp_path, tf32=True)
    assert config(tmp_path, tf32=False).tf32 is False


@pytest.mark.parametrize("use_cache", [False, True])
def test_use_cache_is_set_on_the_model_config(tmp_path, tokenizer, use_cache):
    from fedhf.data.sft import SFTCollator

    from tests.helpers import tweet_sft

    model = tiny_llama_lora(len(tokenizer))
    model.config.use_cache = not use_cache
    FederatedTrainer(model=model, args=config(tmp_path, use_cache=use_cache, num_clients=2, clients_per_round=2,
                                              partition="iid"),
                     train_dataset=tweet_sft(tokenizer, n_train=8, n_test=2)["train"],
                     data_collator=SFTCollator(tokenizer))
    assert model.config.use_cache is use_cache


def test_log_level_sets_transformers_verbosity(digits, tmp_path):
    before = transformers.logging.get_verbosity()
    try:
        _digits_trainer(digits, tmp_path, log_level="error")
        assert transformers.logging.get_verbosity() == logging.ERROR
        _digits_trainer(digits, tmp_path, log_level="info")
        assert transformers.logging.get_verbosity() == logging.INFO
    finally:
        transformers.logging.set_verbosity(before)


class _Collator:
    """default_data_collator on the model's columns, recording (in a file: it may run in a worker process) the
    process it ran in and the columns it got."""

    def __init__(self, path):
        self.path = path

    def __call__(self, rows):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()} {','.join(sorted(rows[0]))}\n")
        return default_data_collator([{k: r[k] for k in ("pixel_values", "label")} for r in rows])


def _train_digits(digits, tmp_path, train=None, **kw):
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=1, local_steps=1, partition="iid",
                  per_device_train_batch_size=8, **kw)
    log = tmp_path / "collated.txt"
    FederatedTrainer(model=tiny_resnet(), args=args, train_dataset=train or digits["train"],
                     data_collator=_Collator(str(log))).train()
    return [(int(pid), columns.split(",")) for pid, columns in (line.split() for line in log.read_text().splitlines())]


def test_dataloader_num_workers_collates_in_worker_processes(digits, tmp_path):
    assert {pid for pid, _ in _train_digits(digits, tmp_path / "a")} == {os.getpid()}
    workers = {pid for pid, _ in _train_digits(digits, tmp_path / "b", dataloader_num_workers=1)}
    assert workers and os.getpid() not in workers


def test_remove_unused_columns_decides_what_reaches_the_collator(digits, tmp_path):
    train = digits["train"].add_column("note", ["a row's note"] * len(digits["train"]))
    kept = _train_digits(digits, tmp_path / "a", train=train, remove_unused_columns=False)
    assert all(columns == ["label", "note", "pixel_values"] for _, columns in kept)
    removed = _train_digits(digits, tmp_path / "b", train=train)  # Trainer's default True
    assert all(columns == ["label", "pixel_values"] for _, columns in removed)


def test_label_names_says_where_the_data_checks_look_for_labels(digits, tmp_path):
    train = digits["train"].add_column("target", ["seven"] * len(digits["train"]))
    digit_trainer(tiny_resnet(), {"train": train, "test": digits["test"]}, config(tmp_path / "a"))  # not a label
    with pytest.raises(ValueError, match="'target' holds strings"):
        digit_trainer(tiny_resnet(), {"train": train, "test": digits["test"]},
                      config(tmp_path / "b", label_names=["target", "label"]))


@pytest.mark.parametrize("settings", [
    {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": False}},
    {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}},  # the old names
])
def test_checkpointing_keywords_reach_the_model(tmp_path, tokenizer, settings):
    from fedhf.data.sft import SFTCollator

    from tests.helpers import tweet_sft

    model = tiny_llama_lora(len(tokenizer))
    calls = []
    enable = model.activation_checkpointing_enable
    model.activation_checkpointing_enable = lambda **kw: calls.append(kw) or enable(**kw)
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=1, local_steps=1, partition="iid",
                  per_device_train_batch_size=4, **settings)
    FederatedTrainer(model=model, args=args, train_dataset=tweet_sft(tokenizer, n_train=16, n_test=2)["train"],
                     data_collator=SFTCollator(tokenizer)).train()
    assert calls == [{"activation_checkpointing_kwargs": {"use_reentrant": False}, "every_n_layers": 1,
                      "offload": False}]
    assert model.base_model.model.is_gradient_checkpointing


def test_hub_private_repo_revision_and_token_reach_the_hub(digits, tmp_path, monkeypatch):
    repos, commits = [], []

    def create_repo(api, repo_id, **kwargs):
        repos.append((repo_id, kwargs.get("private"), kwargs.get("token")))
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(api, repo_id, operations, commit_message, **kwargs):
        commits.append((repo_id, kwargs.get("revision"), api.token))

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", create_commit)
    args = config(tmp_path, num_rounds=1, local_steps=1, save_every_rounds=1, push_to_hub=True,
                  hub_model_id="me/fed-digits", hub_strategy="every_save", hub_private_repo=True,
                  hub_revision="federated", hub_token="hf_given_here")
    digit_trainer(tiny_resnet(), digits, args, evaluate=False).train()
    assert repos == [("me/fed-digits", True, "hf_given_here")]
    assert commits == [("me/fed-digits", "federated", "hf_given_here")]


_PROCESS_GROUP = """
import os, sys
os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
import torch.distributed as dist
calls, real = [], dist.init_process_group
dist.init_process_group = lambda *a, **kw: calls.append(kw) or real(*a, **kw)
from fedhf import FederatedConfig
FederatedConfig(output_dir=sys.argv[2], report_to="none", use_cpu=True, ddp_backend="gloo").device
print("backend", calls[0]["backend"], dist.get_backend())
"""


def test_ddp_backend_makes_the_process_group(tmp_path):
    """A one-process distributed launch (the environment torchrun sets): the group is made with the backend asked
    for. Run in a subprocess so that no group outlives the test."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    out = subprocess.run([sys.executable, "-c", _PROCESS_GROUP, str(port), str(tmp_path / "run")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert "backend gloo gloo" in out.stdout, out.stderr[-2000:]


def test_ddp_timeout_that_a_cpu_run_would_ignore_is_refused(tmp_path):
    assert config(tmp_path, ddp_timeout=1800).ddp_timeout == 1800
    with pytest.raises(ValueError, match="`ddp_timeout`=60 is not applied with use_cpu=True.*init_process_group"):
        config(tmp_path, ddp_timeout=60)
