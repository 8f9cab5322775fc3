"""A quantised base whose new head was quantised too is refused before any work, naming the fix (seen on a CPU
with bitsandbytes 0.50: it turns a newly initialised classifier into a 4/8-bit layer it never quantises)."""

from __future__ import annotations

import warnings

import pytest
from peft import LoraConfig, TaskType, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForSequenceClassification, BitsAndBytesConfig

from tests.helpers import config, tweet_trainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def quantised_minilm(path, **quant):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=3, quantization_config=BitsAndBytesConfig(**quant), device_map="cpu")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return get_peft_model(model, LoraConfig(r=4, target_modules=["query", "value"], task_type=TaskType.SEQ_CLS))


@pytest.mark.parametrize("quant", [{"load_in_4bit": True}, {"load_in_8bit": True}], ids=["nf4", "int8"])
def test_an_unquantised_new_head_is_refused_with_the_skip_modules_fix(minilm, tweets, tokenizer, tmp_path, quant):
    with pytest.raises(ValueError, match=r"never quantised.*llm_int8_skip_modules=\['classifier'\]"):
        tweet_trainer(quantised_minilm(minilm, **quant), tweets, tokenizer, config(tmp_path))
    run = tmp_path / "run"
    assert not run.exists() or not any(run.iterdir())  # nothing written
    # with the fix the same model is accepted
    fixed = quantised_minilm(minilm, **quant, llm_int8_skip_modules=["classifier"])
    tweet_trainer(fixed, tweets, tokenizer, config(tmp_path))
