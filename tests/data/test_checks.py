"""The label check reads the label space a model declares (``config.num_labels`` of a model whose output is that
space), not its class name: a renamed classifier is checked, a causal LM's category column is not a class label."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, ResNetConfig, \
    ResNetForImageClassification

from fedhf.data.checks import _num_labels


def _llama_config(**kw):
    return LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, **kw)


class Renamed(ResNetForImageClassification):  # a user's subclass: its name says nothing about classification
    pass


@pytest.mark.parametrize("build, expected", [
    (lambda: Renamed(ResNetConfig(num_channels=1, embedding_size=8, hidden_sizes=[8], depths=[1], num_labels=7)), 7),
    (lambda: LlamaForSequenceClassification(_llama_config(num_labels=3)), 3),
    (lambda: LlamaForSequenceClassification(_llama_config(num_labels=3, problem_type="regression")), None),
    (lambda: LlamaForCausalLM(_llama_config()), None),  # its config's default num_labels=2 is no head
    (lambda: LlamaForCausalLM(_llama_config(num_labels=5)), None),  # predicts tokens whatever num_labels says
])
def test_the_declared_label_space_is_what_is_checked(build, expected):
    assert _num_labels(build()) == expected
