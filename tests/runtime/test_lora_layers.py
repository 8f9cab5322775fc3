"""Which LoRA layers the product rules (fedhf/core/lora.py, fedhf/server/lora.py) accept: conv LoRA and a folding rule on
a tied weight are refused when the trainer is built (nothing written); fan_in_fan_out layers (GPT-2's Conv1D) run
under the rules that never write into the base weight, with the exact mean that FedSVD promises."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

from fedhf import FederatedTrainer
from fedhf.data.sft import SFTCollator
from fedhf.data.demo import tiny_llama

from tests.helpers import config, digit_trainer, tiny_resnet, tweet_sft

PRODUCT_RULES = ["fedex_lora", "flora", "flexlora", "fedsvd"]
FOLDING_RULES = ["fedex_lora", "flora"]


@pytest.fixture(scope="module")
def sft(tokenizer):
    return tweet_sft(tokenizer, n_train=24, n_test=8, max_length=16)


def nothing_written(tmp_path) -> bool:
    run = tmp_path / "run"
    return not run.exists() or not any(run.iterdir())


@pytest.mark.parametrize("rule", PRODUCT_RULES)
def test_conv_lora_is_refused_before_any_work(digits, tmp_path, rule):
    model = tiny_resnet()
    convs = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)][1:3]
    model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=convs, modules_to_save=["classifier"]))
    with pytest.raises(ValueError, match=r"uses a Conv2d LoRA.*leave conv layers out of target_modules"):
        digit_trainer(model, digits, config(tmp_path, server_rule=rule), evaluate=False)
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("rule", FOLDING_RULES)
def test_folding_into_a_tied_lm_head_is_refused_before_any_work(tokenizer, sft, tmp_path, rule):
    base = tiny_llama(len(tokenizer))
    assert base.lm_head.weight is base.model.embed_tokens.weight  # tied
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "lm_head"],
                                            task_type=TaskType.CAUSAL_LM))
    with pytest.raises(ValueError, match=r"tied embeddings.*out of target_modules.*tie_word_embeddings=False"):
        FederatedTrainer(model=model, args=config(tmp_path, server_rule=rule), train_dataset=sft["train"],
                         data_collator=SFTCollator(tokenizer))
    assert nothing_written(tmp_path)


def gpt2_lora(vocab_size, rank):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    # c_attn is a Conv1D (32 -> 96, weight stored 32 x 96): peft sets fan_in_fan_out for it
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["c_attn"],
                                            fan_in_fan_out=True, task_type=TaskType.CAUSAL_LM))


def effective(model):
    """W + s B A in the orientation of the stored weight, by peft itself (get_delta_weight transposes it)."""
    return {n: (m.get_base_layer().weight + m.get_delta_weight("default")).detach().double().clone()
            for n, m in model.named_modules() if hasattr(m, "get_delta_weight") and "default" in m.lora_A}


@pytest.mark.parametrize("rule", FOLDING_RULES)
def test_fan_in_fan_out_is_refused_for_rules_that_fold_into_the_base(tokenizer, sft, tmp_path, rule):
    with pytest.raises(ValueError, match="fan_in_fan_out"):
        FederatedTrainer(model=gpt2_lora(len(tokenizer), 4), args=config(tmp_path, server_rule=rule),
                         train_dataset=sft["train"], data_collator=SFTCollator(tokenizer))
    assert nothing_written(tmp_path)


# FlexLoRA is exact at full rank (32 = min(in, out) of c_attn), FedSVD at any rank.
@pytest.mark.parametrize("rule,rank", [("flexlora", 32), ("fedsvd", 4)])
def test_fan_in_fan_out_layers_get_the_clients_mean_under_refactorising_rules(tokenizer, sft, tmp_path, rule, rank):
    seen = []

    class Recording(FederatedTrainer):
        def _local_steps(self, ctx, optimizer):
            loss = super()._local_steps(ctx, optimizer)
            seen.append(effective(self.model))
            return loss

    model = gpt2_lora(len(tokenizer), rank)
    args = config(tmp_path, server_rule=rule, num_clients=3, clients_per_round=3, num_rounds=1, local_steps=2,
                  per_device_train_batch_size=4, partition="iid", local_optimizer="adamw", learning_rate=1e-2)
    Recording(model=model, args=args, train_dataset=sft["train"], data_collator=SFTCollator(tokenizer)).train()
    glob = effective(model)
    mean = {n: sum(s[n] for s in seen) / len(seen) for n in glob}
    assert max((glob[n] - mean[n]).abs().max().item() for n in glob) < 1e-5
    start = effective(gpt2_lora(len(tokenizer), rank))
    assert all((glob[n] - start[n]).abs().max() > 1e-4 for n in glob)  # it did train
