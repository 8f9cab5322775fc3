"""The generation metric: first-word parsing and scoring, and greedy generation matching a manual greedy loop."""

import pytest
import torch

from fedhf.demo_data import tiny_llama
from fedhf.metrics.generation import first_word, first_word_accuracy, generate_answers


def test_first_word_accuracy_parses_the_first_word():
    assert first_word("  Positive, clearly") == "positive" and first_word("...") == ""
    assert first_word_accuracy([" positive tweet", "neutral.", "negative"], ["positive", "negative", " negative"]) \
        == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="2 predictions for 1 answers"):
        first_word_accuracy(["a", "b"], ["a"])


def test_generate_answers_is_greedy_per_prompt_despite_left_padding(tokenizer):
    model = tiny_llama(len(tokenizer), seed=1).eval()
    prompts = ["Tweet: good\nSentiment:", "Tweet: a much longer tweet about the weather\nSentiment:"]
    got = generate_answers(model, tokenizer, prompts, max_new_tokens=2)
    for prompt, text in zip(prompts, got):  # each row alone, by argmax, no padding
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        for _ in range(2):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
        n = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert text == tokenizer.decode(ids[0, n:], skip_special_tokens=True)
