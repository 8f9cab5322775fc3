"""fp16 loss scaling (fedhf/trainer/runners/loss_scaling.py), run on the CPU with the GradScaler accelerate makes for fp16 on a GPU
installed by hand (fp16 itself is refused on the CPU): the local steps see the unscaled gradients, a step whose
gradient overflowed is skipped and the scale backs off, and the scale is updated once per local step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.data.sft import SFTCollator

from tests.helpers import tiny_llama_lora, trainable_state, tweet_sft

INIT_SCALE = 2.0 ** 16  # accelerate's (torch's) default first scale


@pytest.fixture(scope="module")
def sft(tokenizer):
    return tweet_sft(tokenizer, n_train=32, n_test=8, max_length=24)


def _trainer(tokenizer, sft, tmp_path, scaler, **overrides):
    base = dict(output_dir=str(tmp_path / "run"), report_to="none", disable_tqdm=True, logging_strategy="no",
                save_strategy="no", seed=0, num_clients=2, num_rounds=1, local_steps=2, per_device_train_batch_size=4,
                use_cpu=True, eval_every_rounds=0, partition="iid", learning_rate=1e-2, local_optimizer="sgd",
                max_grad_norm=1e-3, partition_report=False)
    model = tiny_llama_lora(len(tokenizer))
    trainer = FederatedTrainer(model=model, args=FederatedConfig(**{**base, **overrides}), train_dataset=sft["train"],
                               data_collator=SFTCollator(tokenizer))
    if scaler:  # what Accelerator(mixed_precision="fp16") creates on a CUDA device
        trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    return trainer


@pytest.mark.parametrize("batched", [1, 2], ids=["sequential", "batched_clients"])
def test_a_scaled_backward_gives_the_unscaled_update(tokenizer, sft, tmp_path, batched):
    # max_grad_norm is small enough to clip every step: clipping the scaled gradient would rescale it to the same
    # norm (hiding a missing unscale from SGD's direction but not from its per-step norm), so also compare norms.
    runs = {}
    for scaled in (False, True):
        trainer = _trainer(tokenizer, sft, tmp_path / str(scaled), scaled, batched_clients=batched)
        before = trainable_state(trainer.model)
        trainer.train()
        runs[scaled] = {n: p - before[n] for n, p in trainable_state(trainer.model).items()}
        if scaled:
            state = trainer.accelerator.scaler.state_dict()
            # one update per local step: 2 clients x 2 steps one at a time, 2 shared steps when batched
            assert state["_growth_tracker"] == (4 if batched == 1 else 2)
            assert state["scale"] == INIT_SCALE  # no overflow, no growth yet
    plain, scaled = runs[False], runs[True]
    assert sum(d.norm() for d in plain.values()) > 0
    for name in plain:
        torch.testing.assert_close(scaled[name], plain[name], rtol=1e-5, atol=1e-9)


def test_a_step_with_an_inf_gradient_is_skipped_and_the_scale_halves(tokenizer, sft, tmp_path):
    trainer = _trainer(tokenizer, sft, tmp_path, True, num_clients=1, local_steps=1, max_grad_norm=1.0)
    name, param = next((n, p) for n, p in trainer.model.named_parameters() if p.requires_grad and "lora_B" in n)
    param.register_hook(lambda grad: grad * float("inf"))  # an fp16 overflow in one gradient
    before = trainable_state(trainer.model)
    trainer.train()
    after = trainable_state(trainer.model)
    assert all(torch.equal(after[n], before[n]) for n in before)  # nothing of the step ran
    assert trainer.federated_history[-1]["excluded_clients"] == 0  # skipped, not a NaN model excluded afterwards
    assert trainer.accelerator.scaler.get_scale() == INIT_SCALE / 2
    assert trainer.accelerator.scaler.state_dict()["_growth_tracker"] == 0


def test_processes_training_different_clients_agree_on_one_loss_scale_after_the_round(tmp_path):
    """torchrun without client_parallel: process 1's client overflowed (scale halved, growth count restarted),
    process 0's did not; after the round both hold the smaller scale and growth count, so the next round starts
    alike everywhere and the checkpoint's one copy (process 0's) is the run's."""
    tests = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(tests, "scripts", "loss_scale_agreement_run.py")
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", script, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    states = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert (states[0]["before"]["scale"], states[0]["before"]["_growth_tracker"]) == (INIT_SCALE, 5)
    assert (states[1]["before"]["scale"], states[1]["before"]["_growth_tracker"]) == (INIT_SCALE / 2, 2)
    for state in states:
        assert (state["after"]["scale"], state["after"]["_growth_tracker"]) == (INIT_SCALE / 2, 2)
        assert state["live_scale"] == INIT_SCALE / 2  # the tensor the next scale(loss) multiplies by
