"""The LM head fed a contiguous input: the hook is installed once, makes the head's input contiguous where
transformers slices it (``logits_to_keep``), and changes no logit."""

from __future__ import annotations

import copy as copy_module

import torch

from fedhf.data.demo import tiny_llama
from fedhf.runtime.contiguous_head import feed_head_contiguously
from tests.helpers import tiny_llama_lora


def _forward(model, **kwargs):
    """(whether each head call saw a contiguous input, the logits)."""
    seen = []
    handle = model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: seen.append(args[0].is_contiguous()))
    with torch.no_grad():
        logits = model(input_ids=torch.arange(1, 25).reshape(3, 8), **kwargs).logits
    handle.remove()
    return seen, logits


def test_the_sliced_head_input_becomes_contiguous_and_the_logits_do_not_change():
    model = tiny_llama(64)
    contiguous_before, logits_before = _forward(model, logits_to_keep=1)
    assert contiguous_before == [False]  # transformers hands the head a strided view: the case the hook exists for
    assert feed_head_contiguously(model) and feed_head_contiguously(model)
    assert len(model.get_output_embeddings()._forward_pre_hooks) == 1  # idempotent
    contiguous_after, logits_after = _forward(model, logits_to_keep=1)
    assert contiguous_after == [True]
    torch.testing.assert_close(logits_after, logits_before)  # the same product, up to the kernel's float rounding


def test_a_peft_model_reaches_its_base_head_and_a_copy_keeps_one_hook(tokenizer):
    model = tiny_llama_lora(len(tokenizer))
    assert feed_head_contiguously(model)
    copy = copy_module.deepcopy(model)
    assert feed_head_contiguously(copy)
    for each in (model, copy):
        assert len(each.get_base_model().get_output_embeddings()._forward_pre_hooks) == 1


def test_the_trainer_and_the_generation_metric_install_it(tmp_path, tokenizer):
    from fedhf import FederatedTrainer
    from fedhf.data.sft import SFTCollator
    from fedhf.metrics.generation import generate_answers
    from tests.helpers import config, tweet_sft

    hooks = lambda m: list(m.get_base_model().get_output_embeddings()._forward_pre_hooks.values())  # noqa: E731
    model = tiny_llama_lora(len(tokenizer))
    assert hooks(model) == []
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=1, partition="iid", partition_report=False)
    train = tweet_sft(tokenizer, n_train=8, n_test=1)["train"]
    FederatedTrainer(model=model, args=args, train_dataset=train, data_collator=SFTCollator(tokenizer))
    assert len(hooks(model)) == 1
    fresh = tiny_llama_lora(len(tokenizer))
    generate_answers(fresh, tokenizer, ["Tweet: fine\nSentiment:"], max_new_tokens=1)
    assert len(hooks(fresh)) == 1


def test_a_model_without_an_output_head_is_left_alone():
    assert not feed_head_contiguously(torch.nn.Linear(2, 2))
