"""client_parallel=True: 2 processes (torchrun, gloo on CPU) training every client together give the 1-process
model; combinations that cannot work are refused before any work."""

from __future__ import annotations

import os

import pytest
import torch

from fedhf.trainer.runners.client_parallel import shard

from tests.helpers import config, digit_trainer, lora_minilm, tiny_resnet, tweet_trainer
from tests.end_to_end.test_multiprocess import TORCHRUN, _run

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(TESTS, "scripts", "client_parallel_run.py")


ALGORITHMS = ["fedavg", "scaffold", "fedpac_muon"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The 1- and 2-process runs, launched once for all the algorithms."""
    if TORCHRUN is None:
        pytest.skip("torchrun not installed")
    root = tmp_path_factory.mktemp("client_parallel")
    return {n: _run(n, ALGORITHMS, root / f"p{n}", script_path=SCRIPT) for n in (1, 2)}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_two_processes_training_each_client_together_give_the_one_process_model(runs, algorithm):
    """Each micro-batch of 5 rows is split 3 + 2 over the processes, 2 micro-batches per step, clipping on: the
    same LoRA adapter as one process to float rounding (measured: at most 6e-7 on entries up to 0.12), and each
    client counted once (participants, bytes)."""
    one, two = runs[1][algorithm], runs[2][algorithm]
    assert float(two["history.participants"]) == float(one["history.participants"]) == 3.0  # clients_per_round
    assert float(two["history.uplink_MB"]) == float(one["history.uplink_MB"])
    assert float(two["history.downlink_MB"]) == float(one["history.downlink_MB"])
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=5e-6, msg=name)


def test_a_batch_splits_into_contiguous_row_shards():
    batch = {"input_ids": torch.arange(10).reshape(5, 2), "labels": torch.arange(5), "note": "kept"}
    first, second = shard(batch, 0, 2), shard(batch, 1, 2)
    assert first["input_ids"].tolist() == [[0, 1], [2, 3], [4, 5]] and second["labels"].tolist() == [3, 4]
    assert first["note"] == second["note"] == "kept"


def test_settings_that_cannot_split_a_client_are_refused_before_work(tmp_path, digits, tweets, tokenizer, minilm):
    with pytest.raises(ValueError, match="BatchNorm"):  # the ResNet's averaged buffers
        digit_trainer(tiny_resnet(), digits, config(tmp_path, client_parallel=True), evaluate=False)
    with pytest.raises(ValueError, match="batched_clients"):
        tweet_trainer(lora_minilm(minilm), tweets, tokenizer, config(tmp_path, client_parallel=True, batched_clients=2))
    with pytest.raises(ValueError, match="compute_loss_func"):
        tweet_trainer(lora_minilm(minilm), tweets, tokenizer, config(tmp_path, client_parallel=True),
                      compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.loss)
    assert not (tmp_path / "run").exists() or os.listdir(tmp_path / "run") == []
