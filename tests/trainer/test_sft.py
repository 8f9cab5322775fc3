"""FederatedSFTTrainer: fedhf's round loop on top of trl's SFTTrainer (one loop, by multiple inheritance)."""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

import fedhf
from fedhf import FederatedTrainer
from fedhf.trainer.sft import DEPRECATED_ALIASES, FederatedSFTConfig, FederatedSFTTrainer

from tests.helpers import causal_lm_collator, config, sentiment_pairs, tiny_llama_dir, tokenized_pairs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def tokenizer(tokenizer):
    """A copy of the session's MiniLM tokenizer: trl sets ``eos_token`` on the tokenizer it is given, and the
    session's is shared with tests that expect it to have none (tests/data/test_sft.py)."""
    return copy.deepcopy(tokenizer)


@pytest.fixture(scope="module")
def base(tmp_path_factory, tokenizer):
    return tiny_llama_dir(str(tmp_path_factory.mktemp("tiny_llama")), tokenizer)


@pytest.fixture(scope="module")
def pairs():
    from fedhf.data.demo import load_tweets

    return sentiment_pairs(load_tweets(), 96, 16, max_chars=60)


def lora_llama(base):
    model = AutoModelForCausalLM.from_pretrained(base)
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                                            target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]))


FEDERATION = dict(num_clients=4, clients_per_round=3, num_rounds=2, local_steps=2, per_device_train_batch_size=4,
                  per_device_eval_batch_size=16, eval_every_rounds=0, eval_on_start=True, dirichlet_alpha=1.0,
                  algorithm="fedavg", learning_rate=1.0, partition_report=False)


DEFAULT = object()  # an override that leaves the field to its default


def sft_config(tmp_path, **overrides) -> FederatedSFTConfig:
    base = dict(output_dir=str(tmp_path / "run"), report_to="none", disable_tqdm=True, logging_strategy="no",
                save_strategy="no", seed=0, use_cpu=True, bf16=False, activation_checkpointing=False,
                eos_token="[SEP]", completion_only_loss=True, **FEDERATION)
    return FederatedSFTConfig(**{k: v for k, v in {**base, **overrides}.items() if v is not DEFAULT})


def adapter(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_config_and_trainer_keep_one_round_loop():
    from transformers import Trainer
    from trl import SFTConfig, SFTTrainer

    mro = FederatedSFTTrainer.__mro__
    assert mro[1] is FederatedTrainer and mro.index(SFTTrainer) < mro.index(Trainer)
    assert issubclass(FederatedSFTConfig, fedhf.FederatedConfig) and issubclass(FederatedSFTConfig, SFTConfig)
    assert FederatedSFTTrainer.train is FederatedTrainer.train
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
    args = sft_config(tmp_path, bf16=DEFAULT)  # trl's default precision
    assert args.bf16 is True and args.use_cpu  # trl's rule (bf16 unless fp16); no GPU here, so on the CPU
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
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def _default(f):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def test_the_config_keeps_every_trl_default_fedhf_does_not_set(tmp_path):
    """Field by field, declared and constructed: FederatedSFTConfig's default is SFTConfig's for every field except
    those FederatedConfig sets on purpose (a default other than TrainingArguments', or a value its __post_init__
    changes). use_cpu=True because SFTConfig alone refuses its own bf16 default on a machine without a GPU."""
    from transformers import TrainingArguments
    from trl import SFTConfig

    kwargs = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    plain, federated = TrainingArguments(**kwargs), fedhf.FederatedConfig(**kwargs)
    declared = {f.name: f for f in dataclasses.fields(fedhf.FederatedConfig)}
    owned = {f.name for f in dataclasses.fields(TrainingArguments)
             if _default(f) != _default(declared[f.name]) or getattr(plain, f.name) != getattr(federated, f.name)}
    assert owned == {"learning_rate", "weight_decay", "average_tokens_across_devices", "logging_steps",
                     "save_strategy"}  # each documented by FederatedConfig
    trl, ours = SFTConfig(**kwargs), FederatedSFTConfig(**kwargs)
    ours_declared = {f.name: f for f in dataclasses.fields(FederatedSFTConfig)}
    checked = [f.name for f in dataclasses.fields(SFTConfig) if f.name not in owned]
    for name in checked:
        if name not in DEPRECATED_ALIASES:  # trl's default is set through the current name (next test)
            assert _default(ours_declared[name]) == _default(SFTConfig.__dataclass_fields__[name]), name
        assert getattr(ours, name) == getattr(trl, name), name
    assert len(checked) > 100 and {"bf16", "gradient_checkpointing", "max_length"} <= set(checked)
    assert ours.bf16 is True and ours.activation_checkpointing is True  # the two trl overrides once reverted


def test_trls_checkpointing_default_and_its_peft_wrap_warn_nothing(base, pairs, tokenizer, tmp_path):
    """trl's gradient-checkpointing default is set as ``activation_checkpointing`` (transformers' current name), so
    a config the user wrote without it does not warn "`gradient_checkpointing` is deprecated"; trl's wrap of
    ``peft_config`` does not show transformers' warning about peft's read of ``is_gradient_checkpointing``. A user
    who types the old name still gets its meaning and transformers' warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        default = FederatedSFTConfig(output_dir=str(tmp_path / "a"), report_to="none", use_cpu=True)
        FederatedSFTTrainer(model=AutoModelForCausalLM.from_pretrained(base),
                            args=sft_config(tmp_path, eval_on_start=False), train_dataset=pairs["train"],
                            processing_class=tokenizer,
                            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert not [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert default.activation_checkpointing is True and default.gradient_checkpointing is True  # trl's default
    with pytest.warns(FutureWarning, match="`gradient_checkpointing` is deprecated"):
        typed = FederatedSFTConfig(output_dir=str(tmp_path / "b"), report_to="none", use_cpu=True,
                                   gradient_checkpointing=False)
    assert typed.activation_checkpointing is False


@pytest.mark.skipif(torch.accelerator.is_available(), reason="checks the machine without a GPU")
def test_trls_bf16_default_on_a_machine_without_a_gpu_runs_on_the_cpu(tmp_path):
    """SFTConfig resolves bf16 to True (no fp16) and then refuses it without use_cpu; FederatedSFTConfig resolves it
    the same way and, as for an explicit bf16=True, runs on the CPU."""
    from trl import SFTConfig

    with pytest.raises(ValueError, match="use_cpu"):
        SFTConfig(output_dir=str(tmp_path), report_to="none")
    args = FederatedSFTConfig(output_dir=str(tmp_path), report_to="none")
    assert args.bf16 is True and args.use_cpu is True
    assert FederatedSFTConfig(output_dir=str(tmp_path), report_to="none", bf16=False).bf16 is False


def test_a_streaming_train_dataset_is_refused_by_position_too(base, pairs, tokenizer, tmp_path):
    """FederatedSFTTrainer hands train_dataset to FederatedTrainer by position; the streaming check still sees it."""
    stream = pairs["train"].to_iterable_dataset()
    with pytest.raises(ValueError, match="IterableDataset \\(streaming\\)"):
        FederatedSFTTrainer(model=lora_llama(base), args=sft_config(tmp_path), train_dataset=stream,
                            processing_class=tokenizer)
    with pytest.raises(ValueError, match="IterableDataset \\(streaming\\)"):
        FederatedTrainer(lora_llama(base), config(tmp_path), causal_lm_collator(0), stream)


def test_two_processes_give_the_one_process_sft_run(tmp_path):
    """torchrun, gloo, CPU: 4 clients, 3 per round, so one process trains 2 clients and the other 1 (different
    numbers of trl loss calls, whose metric gathers used to pair with the round's aggregation and crash). Same
    adapter and same eval loss (evaluate() gathers over the processes) as one process."""
    from tests.end_to_end.test_multiprocess import TORCHRUN, _run

    if TORCHRUN is None:
        pytest.skip("torchrun not installed")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "sft_multiprocess_run.py")
    one, two = (_run(n, ["sft"], tmp_path / f"p{n}", script_path=script)["sft"] for n in (1, 2))
    assert one.keys() == two.keys()
    assert float(one["history.participants"]) == float(two["history.participants"]) == 3
    assert any(float(t.abs().max()) > 0 for n, t in one.items() if "lora_B" in n)  # it trained (B starts at 0)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-7, msg=name)
