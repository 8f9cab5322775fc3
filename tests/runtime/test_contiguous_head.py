"""The LM head fed a contiguous input: the hook is installed once, makes the head's input contiguous where
transformers slices it (``logits_to_keep``), and changes no logit."""

from __future__ import annotations

import torch

from fedhf.data.demo import tiny_llama
from fedhf.runtime.contiguous_head import feed_head_contiguously
from tests.helpers import tiny_llama_lora


def _head_inputs_contiguous(model, **kwargs) -> list:
    seen = []
    handle = model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: seen.append(args[0].is_contiguous()))
    with torch.no_grad():
        logits = model(input_ids=torch.arange(1, 25).reshape(3, 8), **kwargs).logits
    handle.remove()
    return seen, logits


def test_the_sliced_head_input_becomes_contiguous_and_the_logits_do_not_change():
    model = tiny_llama(64)
    plain, sliced = _head_inputs_contiguous(model, logits_to_keep=1)
    assert plain == [False]  # transformers hands the head a strided view: the case the hook exists for
    assert feed_head_contiguously(model) and feed_head_contiguously(model)
    assert len(model.get_output_embeddings()._forward_pre_hooks) == 1  # idempotent
    hooked, last = _head_inputs_contiguous(model, logits_to_keep=1)
    assert hooked == [True]
    torch.testing.assert_close(last, sliced)  # the same product, up to the kernel's float rounding


def test_a_peft_model_reaches_its_base_head(tokenizer):
    model = tiny_llama_lora(len(tokenizer))
    assert feed_head_contiguously(model)
    assert len(model.get_base_model().get_output_embeddings()._forward_pre_hooks) == 1


def test_a_model_without_an_output_head_is_left_alone():
    assert not feed_head_contiguously(torch.nn.Linear(2, 2))
