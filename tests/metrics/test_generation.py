"""The generation metric: first-word parsing and scoring, and greedy generation matching a manual greedy loop."""

import math

import pytest
import torch

from fedhf.data.demo import tiny_llama
from fedhf.metrics.generation import GenerationEvalCallback, first_word, first_word_accuracy, generate_answers


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



def _prompt_rows(model):
    """Record the unpadded prompt rows that reach ``model.generate``: a list filled on each call."""
    rows, generate = [], model.generate

    def recording(input_ids, attention_mask, **kwargs):
        rows.extend(ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask))
        return generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    model.generate = recording
    return rows


@pytest.fixture
def bos_tokenizer(tokenizer):
    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tok.bos_token = "[CLS]"
    return tok


LONG = "Tweet: " + " ".join(f"word{i}" for i in range(40)) + "\nSentiment:"  # over 64 tokens


def test_a_long_prompt_is_whole_by_default_and_keeps_its_bos_when_cut(bos_tokenizer):
    tok, model = bos_tokenizer, tiny_llama(len(bos_tokenizer), seed=1).eval()
    tokens = [tok.cls_token_id] + tok(LONG, add_special_tokens=False)["input_ids"]
    short = [tok.cls_token_id] + tok("short", add_special_tokens=False)["input_ids"]
    assert len(tokens) > 64
    rows = _prompt_rows(model)
    generate_answers(model, tok, [LONG, "short"], max_new_tokens=2)
    assert rows == [tokens, short]
    rows.clear()
    generate_answers(model, tok, [LONG, "short"], max_new_tokens=2, max_prompt_tokens=8)
    assert rows == [[tok.cls_token_id] + tokens[-7:], short]
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        generate_answers(model, tok, [LONG], max_prompt_tokens=1)


def test_a_chat_prompt_is_answered_after_the_templates_generation_prompt(tokenizer):
    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    chat = [{"role": "user", "content": "how is the weather"}]
    with pytest.raises(ValueError, match="chat template"):
        GenerationEvalCallback(tok, [chat], ["fine"])
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} [SEP] {% endfor %}"
                         "{% if add_generation_prompt %}<assistant> {% endif %}")
    model = tiny_llama(len(tok), seed=1).eval()
    rows = _prompt_rows(model)
    got = generate_answers(model, tok, [chat, "plain text"], max_new_tokens=2)
    assert rows[0] == tok("<user> how is the weather [SEP] <assistant> ", add_special_tokens=False)["input_ids"]
    assert rows[1] == tok("plain text", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([rows[0]])
    for _ in range(2):  # and the answer is the greedy continuation of that row
        ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
    assert got[0] == tok.decode(ids[0, len(rows[0]):], skip_special_tokens=True)


def test_the_callback_passes_max_prompt_tokens(bos_tokenizer):
    from types import SimpleNamespace

    tok, model = bos_tokenizer, tiny_llama(len(bos_tokenizer), seed=1).eval()
    tokens = [tok.cls_token_id] + tok(LONG, add_special_tokens=False)["input_ids"]
    rows = _prompt_rows(model)
    for cut, expected in ((6, [tok.cls_token_id] + tokens[-5:]), (None, tokens)):
        rows.clear()
        metrics = {"eval_loss": 1.0}
        GenerationEvalCallback(tok, [LONG], ["positive"], max_prompt_tokens=cut).on_evaluate(
            SimpleNamespace(per_device_eval_batch_size=2), None, None, model=model, metrics=metrics)
        assert rows == [expected] and "eval_generation_accuracy" in metrics
        assert metrics["eval_perplexity"] == pytest.approx(math.e)


def test_max_prompt_tokens_below_two_is_refused_by_the_callback_and_the_function(tokenizer):
    """A cut prompt keeps its BOS and at least one prompt token: the callback refuses 1 when built (before any
    training), ``generate_answers`` when called."""
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        GenerationEvalCallback(tokenizer, max_prompt_tokens=1)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        generate_answers(tiny_llama(len(tokenizer)), tokenizer, ["Tweet: good"], max_prompt_tokens=1)


def test_the_first_word_is_a_word_in_any_script_and_an_empty_answer_matches_nothing():
    """It kept [a-z0-9] only: any prediction matched an answer in Chinese or Cyrillic, an empty output included."""
    assert [first_word(t) for t in ("正面", "négatif.", "Хорошо!", " Positive.")] == ["正面", "négatif", "хорошо",
                                                                                     "positive"]
    assert first_word_accuracy(["负面", "中性", ""], ["正面"] * 3) == 0.0
    assert first_word_accuracy(["плохо", "хорошо"], ["хорошо", "Хорошо"]) == 0.5
    assert first_word_accuracy(["", "..."], ["", "?"]) == 0.0  # a reference without a word matches nothing


def test_the_callbacks_metrics_reach_the_log_every_evaluated_round(tokenizer, tmp_path):
    """GenerationEvalCallback adds its metrics after Trainer logged the evaluation: they are logged too (console,
    report_to), with the values the history holds."""
    from transformers import TrainerCallback

    from fedhf import FederatedTrainer
    from fedhf.data.sft import SFTCollator
    from tests.helpers import config, tiny_llama_lora, tweet_sft

    class Logs(TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs))

    sft, logs = tweet_sft(tokenizer, n_train=32, n_test=4, max_length=32), Logs()
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=2, local_steps=1, partition="iid",
                  partition_report=False, eval_every_rounds=1, logging_strategy="steps", logging_steps=1)
    trainer = FederatedTrainer(model=tiny_llama_lora(len(tokenizer)), args=args, train_dataset=sft["train"],
                               eval_dataset=sft["test"], data_collator=SFTCollator(tokenizer),
                               callbacks=[GenerationEvalCallback(tokenizer), logs])
    trainer.train()
    logged = [log["eval_perplexity"] for log in logs.logs if "eval_perplexity" in log]
    assert logged == [h["eval_perplexity"] for h in trainer.federated_history if "eval_perplexity" in h]
    assert len(logged) == 2
