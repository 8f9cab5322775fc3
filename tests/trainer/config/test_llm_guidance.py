"""An SGD algorithm at an AdamW-scale learning rate on a causal LM gets a warning naming the fix."""

from __future__ import annotations

from fedhf.algorithms import compose
from fedhf.data.demo import tiny_llama
from fedhf.trainer.config.llm_guidance import sgd_lr_message

from tests.helpers import tiny_llama_lora, tiny_resnet


def test_sgd_at_an_adamw_lr_on_a_causal_lm_is_warned_with_the_fix():
    llm, adapter = tiny_llama(64), tiny_llama_lora(64)
    for model in (llm, adapter):  # a plain causal LM and a peft one
        message = sgd_lr_message(model, compose("fedavg", learning_rate=1e-3))
        assert "'fedavg' trains its clients with SGD, and learning_rate=0.001" in message
        assert "algorithm='fadam_gt' or 'local_adamw' at learning_rate=1e-3" in message
    assert sgd_lr_message(adapter, compose("fedavg")) is None  # SGD at its own lr, 0.1
    assert sgd_lr_message(adapter, compose("scaffold", learning_rate=0.01)) is None  # at the floor
    assert sgd_lr_message(adapter, compose("fadam_gt", learning_rate=1e-3)) is None  # an Adam-type client
    assert sgd_lr_message(tiny_resnet(), compose("fedavg", learning_rate=1e-3)) is None  # not a causal LM
