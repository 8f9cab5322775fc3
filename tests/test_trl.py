"""FederatedSFTTrainer: fedhf's round loop on top of trl's SFTTrainer (one loop, by multiple inheritance)."""

from __future__ import annotations

import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

import fedhf
from fedhf import FederatedTrainer
from fedhf.trl import FederatedSFTConfig, FederatedSFTTrainer

from .helpers import causal_lm_collator, config, sentiment_pairs, tiny_llama_dir, tokenized_pairs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def base(tmp_path_factory, tokenizer):
    return tiny_llama_dir(str(tmp_path_factory.mktemp("tiny_llama")), tokenizer)


@pytest.fixture(scope="module")
def pairs():
    from fedhf.demo_data import load_tweets

    return sentiment_pairs(load_tweets(), 96, 16, max_chars=60)


def lora_llama(base):
    model = AutoModelForCausalLM.from_pretrained(base)
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                                            target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]))


FEDERATION = dict(num_clients=4, clients_per_round=3, num_rounds=2, local_steps=2, per_device_train_batch_size=4,
                  per_device_eval_batch_size=16, eval_every_rounds=0, eval_on_start=True, dirichlet_alpha=1.0,
                  algorithm="fedavg", learning_rate=1.0, partition_report=False)


def sft_config(tmp_path, **overrides) -> FederatedSFTConfig:
    base = dict(output_dir=str(tmp_path / "run"), report_to="none", disable_tqdm=True, logging_strategy="no",
                save_strategy="no", seed=0, use_cpu=True, bf16=False, gradient_checkpointing=False,
                eos_token="[SEP]", completion_only_loss=True, **FEDERATION)
    return FederatedSFTConfig(**{**base, **overrides})


def adapter(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_config_and_trainer_keep_one_round_loop():
    from transformers import Trainer
    from trl import SFTConfig, SFTTrainer

    mro = FederatedSFTTrainer.__mro__
    assert mro[1] is FederatedTrainer and mro.index(SFTTrainer) < mro.index(Trainer)
    assert issubclass(FederatedSFTConfig, fedhf.FederatedConfig) and issubclass(FederatedSFTConfig, SFTConfig)
    assert FederatedSFTTrainer.train is FederatedTrainer.train
    assert FederatedSFTTrainer.compute_loss is SFTTrainer.compute_loss
    assert fedhf.FederatedSFTTrainer is FederatedSFTTrainer  # lazily exported


def test_trl_path_equals_the_plain_path_with_the_same_masking(base, pairs, tokenizer, tmp_path):
    """prompt/completion data with completion_only_loss: trl tokenises and masks the prompt; the plain path gets the
    same tokens and labels made by hand. Both are a mean over completion tokens, so one SGD run = the other."""
    plain_model = lora_llama(base)
    data = tokenized_pairs(pairs, tokenizer)
    plain = FederatedTrainer(model=plain_model, args=config(tmp_path / "plain", **FEDERATION),
                             train_dataset=data["train"], eval_dataset=data["test"],
                             data_collator=causal_lm_collator(tokenizer.pad_token_id))
    plain.train()

    trl_model = lora_llama(base)
    sft = FederatedSFTTrainer(model=trl_model, args=sft_config(tmp_path / "trl"), train_dataset=pairs["train"],
                              eval_dataset=pairs["test"], processing_class=tokenizer)
    assert sft.train_dataset["input_ids"] == data["train"]["input_ids"]  # same rows, same order, same tokens
    assert sft.train_dataset["labels"] == data["train"]["labels"]
    assert [list(p) for p in sft.client_partitions] == [list(p) for p in plain.client_partitions]
    sft.train()

    a, b = adapter(plain_model), adapter(trl_model)
    assert a.keys() == b.keys()
    changed = [n for n in a if not torch.equal(a[n], adapter(lora_llama(base))[n])]
    assert changed  # the runs trained something
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5)
    plain_losses = [h["eval_loss"] for h in plain.federated_history if "eval_loss" in h]
    trl_losses = [h["eval_loss"] for h in sft.federated_history if "eval_loss" in h]
    assert trl_losses == pytest.approx(plain_losses, abs=1e-4)
    assert trl_losses[-1] < trl_losses[0] - 0.2  # and it learns


def test_a_trl_run_with_peft_config_and_bf16_lowers_eval_loss(base, pairs, tokenizer, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(base)
    args = sft_config(tmp_path, bf16=True)  # trl's default precision
    sft = FederatedSFTTrainer(model=model, args=args, train_dataset=pairs["train"], eval_dataset=pairs["test"],
                              processing_class=tokenizer,
                              peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    sft.train()
    losses = [h["eval_loss"] for h in sft.federated_history if "eval_loss" in h]
    assert losses[-1] < losses[0] - 0.2, losses
    assert sft.federated_history[-1]["participants"] == 3


def test_packing_with_a_label_split_is_refused(tmp_path):
    with pytest.raises(ValueError, match="packing.*partition='iid'"):
        sft_config(tmp_path, packing=True, partition="dirichlet")
    sft_config(tmp_path, packing=True, partition="iid")  # rows merge, but an IID split does not need them


def test_a_plain_config_is_refused(base, pairs, tmp_path):
    with pytest.raises(TypeError, match="FederatedSFTConfig"):
        FederatedSFTTrainer(model=lora_llama(base), args=config(tmp_path), train_dataset=pairs["train"])


def test_client_partitions_with_packing_are_refused(base, pairs, tmp_path):
    with pytest.raises(ValueError, match="client_partitions.*packing"):
        FederatedSFTTrainer(model=lora_llama(base), args=sft_config(tmp_path, packing=True, partition="iid"),
                            train_dataset=pairs["train"], client_partitions=[[0], [1], [2], [3]])


def test_fedhf_imports_without_trl_and_names_the_install_when_asked_for_it():
    import os
    import subprocess
    import sys

    code = ("import sys; sys.modules['trl'] = None\n"  # trl absent
            "import fedhf\n"
            "try:\n    fedhf.FederatedSFTTrainer\nexcept ImportError as err:\n    print(err)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install trl" in out.stdout


def test_qlora_through_the_trl_path(base, pairs, tokenizer, tmp_path):
    """A 4-bit base under FederatedSFTTrainer: trl keeps the adapter in bf16 (QLoRA paper); fedhf keeps the global
    adapter in fp32, federates only it, and leaves the quantised base untouched."""
    from peft import prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(
            base, quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
            device_map="cpu")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if p.dtype == torch.uint8}
    sft = FederatedSFTTrainer(model=model, args=sft_config(tmp_path), train_dataset=pairs["train"],
                              eval_dataset=pairs["test"], processing_class=tokenizer,
                              peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    federated = {n: p for n, p in sft.model.named_parameters() if p.requires_grad}
    assert federated and all("lora_" in n and p.dtype == torch.bfloat16 for n, p in federated.items())
    sft.train()
    losses = [h["eval_loss"] for h in sft.federated_history if "eval_loss" in h]
    assert losses[-1] < losses[0] - 0.2, losses
    numel = sum(p.numel() for p in federated.values())
    assert sft.federated_history[-1]["uplink_MB"] * 2**20 == 4 * numel * 3 * 2  # fp32 deltas x 3 clients x 2 rounds
    after = [p for p in sft.model.named_parameters() if p[1].dtype == torch.uint8]  # same modules, same order
    assert len(after) == len(frozen) == 14
    assert all(torch.equal(a, b) for a, (_, b) in zip(frozen.values(), after))
