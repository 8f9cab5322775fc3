"""The LLM path on a real pretrained LLM: Gemma-3-270M (bundled-gemma-3-270m, the llm-demo extra) with LoRA on
the bundled tweets as instructions. Small budgets (a few local steps, 16-row evaluations): what is checked is that
the path works on a real 268 M-parameter model with its 262 K vocabulary, its tokenizer and a chat template, not
how well it learns (benchmarks/ and ``make demo-llm`` say that)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model

from fedhf import FederatedTrainer
from fedhf.data.demo import load_tweet_instructions, subsample
from fedhf.data.sft import SFTCollator, tokenize_sft
from fedhf.runtime.hardware import cpu_has_bf16_matmul

from tests.helpers import config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
DTYPE = torch.bfloat16 if cpu_has_bf16_matmul() else torch.float32  # the base's; LoRA stays fp32


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma_dir)


def gemma_lora(gemma_dir, dtype=DTYPE, seed: int = 0):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=dtype)
    torch.manual_seed(seed)
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                            task_type=TaskType.CAUSAL_LM))


@pytest.fixture(scope="module")
def tweets(gemma_tokenizer):
    splits = load_tweet_instructions()
    return {"train": tokenize_sft(subsample(splits["train"], 96), gemma_tokenizer, max_length=64),
            "test": tokenize_sft(subsample(splits["test"], 16), gemma_tokenizer, max_length=64)}


FEDERATION = dict(num_clients=4, clients_per_round=2, num_rounds=2, local_steps=3, per_device_train_batch_size=8,
                  per_device_eval_batch_size=16, partition_report=False)


def test_lora_with_a_second_order_algorithm_lowers_eval_loss(gemma_dir, gemma_tokenizer, tweets, tmp_path):
    args = config(tmp_path, algorithm="fedpac_muon", learning_rate=0.02, eval_on_start=True, eval_every_rounds=2,
                  **FEDERATION)
    trainer = FederatedTrainer(model=gemma_lora(gemma_dir), args=args, train_dataset=tweets["train"],
                               eval_dataset=tweets["test"], data_collator=SFTCollator(gemma_tokenizer))
    assert trainer.labelled_logits  # Gemma3ForCausalLM: the head only at the answer tokens
    trainer.train()
    losses = [h["eval_loss"] for h in trainer.federated_history if "eval_loss" in h]
    assert len(losses) == 2 and losses[-1] < losses[0] - 1.0, losses
