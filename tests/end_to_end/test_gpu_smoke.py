"""GPU smoke tests: the tiny Llama + LoRA trained on "cuda" (skipped without a GPU).

Run on a GPU machine with ``python -m pytest -q tests/end_to_end/test_gpu_smoke.py``. They catch what CPU runs cannot: a
tensor left on the CPU meeting one on the GPU (loss accumulators, the round's sums, FLoRA's seeded A, tensors read
back from a checkpoint or the client store), and fp16's loss scaling, which only exists on a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import TrainerCallback

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.data.sft import SFTCollator

from tests.helpers import tiny_llama_lora, trainable_state, tweet_sft

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def sft(tokenizer):
    return tweet_sft(tokenizer, n_train=48, n_test=8, max_length=24)


class StopAfter(TrainerCallback):
    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.rounds


def _trainer(tokenizer, sft, out, callbacks=None, **overrides):
    base = dict(output_dir=str(out), report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no",
                seed=0, num_clients=2, num_rounds=1, local_steps=2, per_device_train_batch_size=4, use_cpu=False,
                eval_every_rounds=0, partition="iid", learning_rate=0.05, partition_report=False)
    args = FederatedConfig(**{**base, **overrides})
    return FederatedTrainer(model=tiny_llama_lora(len(tokenizer)), args=args, train_dataset=sft["train"],
                            eval_dataset=sft["test"], data_collator=SFTCollator(tokenizer), callbacks=callbacks)


def _trained(trainer):
    """Train; check the run stayed on the GPU and moved the model; return the update and the final tensors."""
    before = trainable_state(trainer.model)
    trainer.train()
    after = trainable_state(trainer.model)
    assert all(t.device.type == "cuda" for t in after.values())
    assert all(torch.isfinite(t).all() for t in after.values())
    assert math.isfinite(trainer.federated_history[-1]["train_loss"])
    assert trainer.federated_history[-1]["excluded_clients"] == 0
    update = {n: after[n] - before[n] for n in after}
    assert sum(float(d.norm()) for d in update.values()) > 0
    return update, after


def test_fedavg_round_on_the_gpu(tokenizer, sft, tmp_path):
    trainer = _trainer(tokenizer, sft, tmp_path / "run", algorithm="fedavg")
    _trained(trainer)
    assert math.isfinite(trainer.evaluate()["eval_loss"])


def test_flora_on_the_gpu(tokenizer, sft, tmp_path):
    trainer = _trainer(tokenizer, sft, tmp_path / "run", algorithm="fedavg", server_rule="flora", num_rounds=2)
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "q_proj.base_layer" in n}
    _trained(trainer)
    folded = {n: p for n, p in trainer.model.named_parameters() if n in base}
    assert any(not torch.equal(folded[n], base[n]) for n in base)  # the rounds' products went into the base


def test_a_resumed_run_on_the_gpu_ends_bit_for_bit_as_an_uninterrupted_one(tokenizer, sft, tmp_path):
    # SCAFFOLD: per-client state in the client store (budget 0: spilled to disk and read back) and a server state,
    # both restored from the checkpoint onto the GPU.
    settings = dict(algorithm="scaffold", num_rounds=3, save_every_rounds=1, full_determinism=True,
                    client_state_budget_mb=0)
    _, full = _trained(_trainer(tokenizer, sft, tmp_path / "full", **settings))
    _trainer(tokenizer, sft, tmp_path / "cut", callbacks=[StopAfter(1)], **settings).train()
    resumed = _trainer(tokenizer, sft, tmp_path / "cut", **settings)
    resumed.train(resume_from_checkpoint=True)
    again = trainable_state(resumed.model)
    assert all(torch.equal(full[n], again[n]) for n in full)


def test_bf16_on_the_gpu(tokenizer, sft, tmp_path):
    _trained(_trainer(tokenizer, sft, tmp_path / "run", bf16=True))


def test_fp16_on_the_gpu_steps_on_unscaled_gradients(tokenizer, sft, tmp_path):
    # SGD is not scale-invariant: a gradient left scaled by 65,536 would give a 65,536x larger update.
    settings = dict(local_optimizer="sgd", learning_rate=1e-2, max_grad_norm=0.0)
    plain, _ = _trained(_trainer(tokenizer, sft, tmp_path / "fp32", **settings))
    trainer = _trainer(tokenizer, sft, tmp_path / "fp16", fp16=True, **settings)
    assert trainer.accelerator.scaler is not None
    scaled, _ = _trained(trainer)
    norm = lambda update: math.sqrt(sum(float(d.double().pow(2).sum()) for d in update.values()))  # noqa: E731
    assert norm(scaled) == pytest.approx(norm(plain), rel=0.1)  # fp16 autocast rounding only
    cosine = sum(float((scaled[n].double() * plain[n].double()).sum()) for n in plain) / (norm(scaled) * norm(plain))
    assert cosine > 0.99


def test_fsdp_at_world_size_one_on_the_gpu_gives_the_unsharded_model(tokenizer, sft, tmp_path, monkeypatch):
    """FSDP2 over a process group of one (NCCL): the round runs on the GPU shards and ends with the model of the
    unsharded run; save_model writes the consolidated adapter. Last in this file: it leaves accelerate's state reset."""
    import os

    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    from tests.end_to_end.test_multiprocess import _free_port

    _, plain = _trained(_trainer(tokenizer, sft, tmp_path / "plain", algorithm="fedavg"))
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "1", "RANK": "0",
                       "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        trainer = _trainer(tokenizer, sft, tmp_path / "fsdp", algorithm="fedavg", fsdp=True)
        assert trainer.shards.active
        trainer.train()
        assert all(t.device.type == "cuda" for t in trainer.plan.params.values())
        gathered = trainer.shards.full_state_dict()
        for name, tensor in plain.items():
            torch.testing.assert_close(gathered[name].float(), tensor.float().cpu(), rtol=1e-5, atol=1e-6, msg=name)
        trainer.save_model(str(tmp_path / "saved"))
        assert os.path.isfile(tmp_path / "saved" / "adapter_model.safetensors")
    finally:
        dist.destroy_process_group()
        AcceleratorState._reset_state(True)
