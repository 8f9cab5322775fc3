"""The label check reads the label space a model declares (``config.num_labels`` of a model whose output is that
space), not its class name: a renamed classifier is checked, a causal LM's category column is not a class label."""

from __future__ import annotations

import pytest
from transformers import BertConfig, BertForMultipleChoice, BertForSequenceClassification, BertModel, LlamaConfig, \
    LlamaForCausalLM, LlamaForSequenceClassification, ResNetConfig, ResNetForImageClassification

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


def _bert_config(**kw):
    return BertConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, **kw)


def _headless_lora():
    from peft import LoraConfig, get_peft_model

    return get_peft_model(BertModel(_bert_config()), LoraConfig(r=2, target_modules=["query"]))


class Scorer(Renamed):  # a custom classifier: no *ForSequenceClassification name, num_labels declared
    pass


@pytest.mark.parametrize("build, labels, refused", [
    # labels index the 4 choices of each row, whatever num_labels (2 by default) says
    (lambda: BertForMultipleChoice(_bert_config()), [0, 1, 2, 3], False),
    # no head: the class column only feeds the split
    (lambda: BertModel(_bert_config()), [0, 3, 5], False),
    (_headless_lora, [0, 3, 5], False),  # the same through peft's wrapper
    (lambda: BertForSequenceClassification(_bert_config(num_labels=3)), [0, 3], True),
    (lambda: Scorer(ResNetConfig(num_channels=1, embedding_size=8, hidden_sizes=[8], depths=[1], num_labels=2)),
     [0, 2], True),
])
def test_labels_are_refused_only_beyond_a_declared_label_space(build, labels, refused):
    import datasets

    from fedhf.data.checks import _check_label_values

    data = datasets.Dataset.from_dict({"label": labels})
    if refused:
        with pytest.raises(ValueError, match="outside"):
            _check_label_values(data, "label", "train_dataset", _num_labels(build()))
    else:
        _check_label_values(data, "label", "train_dataset", _num_labels(build()))
