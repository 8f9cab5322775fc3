"""use_liger_kernel: Liger's Triton kernels on the resident model on a CUDA GPU; refused with the reason on the CPU
and with the install command where liger-kernel is missing, before any work."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from fedhf import FederatedTrainer
from fedhf.data.demo import tiny_llama
from fedhf.data.sft import SFTCollator
from fedhf.runtime.liger import GPU_ONLY, INSTALL, liger_refusal

from tests.helpers import IdsOnly, answer_rows, config, tiny_llama_lora


def test_the_refusal_names_the_reason_gpu_first_then_the_install_command():
    assert liger_refusal(on_gpu=False, installed=True) == GPU_ONLY
    assert liger_refusal(on_gpu=False, installed=False) == GPU_ONLY  # no install would help on the CPU
    assert liger_refusal(on_gpu=True, installed=False) == INSTALL and "pip install liger-kernel" in INSTALL
    assert liger_refusal(on_gpu=True, installed=True) is None


def test_on_the_cpu_use_liger_kernel_is_refused_before_any_work(tmp_path):
    args = config(tmp_path, use_liger_kernel=True)
    with pytest.raises(ValueError, match="use_liger_kernel.*Triton, GPU only"):
        FederatedTrainer(model=tiny_llama_lora(100), args=args, train_dataset=answer_rows(16),
                         data_collator=SFTCollator(IdsOnly()))
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None,
                    reason="Liger's kernels need a CUDA GPU and liger-kernel")
def test_on_a_gpu_the_resident_model_runs_liger_kernels_and_trains(tmp_path):
    from peft import LoraConfig, TaskType, get_peft_model

    model = get_peft_model(tiny_llama(100).cuda(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                            task_type=TaskType.CAUSAL_LM))
    args = config(tmp_path, use_cpu=False, use_liger_kernel=True, num_rounds=1, learning_rate=0.05)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=answer_rows(64),
                               data_collator=SFTCollator(IdsOnly()))
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    assert model.get_base_model().model.norm.forward.__func__ is LigerRMSNorm.forward  # patched in place
    trainer.train()
    assert torch.isfinite(torch.tensor(trainer.federated_history[-1]["train_loss"]))


def test_liger_kernel_config_reaches_liger_as_trainer_passes_it(monkeypatch):
    """``liger_kernel_config`` is handed to transformers' ``apply_liger_kernel`` unchanged (the kernels themselves
    need a GPU: the call is recorded here instead)."""
    import types

    import transformers.integrations.liger as integration

    from fedhf.runtime.liger import apply_liger

    calls = []
    monkeypatch.setattr(integration, "apply_liger_kernel", lambda model, config: calls.append((model, config)))
    model, wanted = torch.nn.Linear(2, 2), {"rope": False, "swiglu": True}
    apply_liger(model, types.SimpleNamespace(use_liger_kernel=True, liger_kernel_config=wanted))
    apply_liger(model, types.SimpleNamespace(use_liger_kernel=False, liger_kernel_config=wanted))
    assert calls == [(model, wanted)]
