"""gradient_accumulation_steps = G: one local step is one optimizer step over G micro-batches, with the update
of one step over their union (per-row mean for a classifier, per-token mean for a causal LM)."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorForSeq2Seq, LlamaConfig, LlamaForCausalLM

from fedhf import FederatedTrainer

from tests.helpers import config, lora_minilm, trainable_state, tweet_trainer

# 12 rows: batch 16 x G=1 is one 12-row batch; batch 8 x G=2 is micro-batches of 8 and 4 rows (the same rows,
# in the same order: the client's shuffle does not depend on the batch size), so a plain 1/G weighting would
# overweight the short one and the test would fail.
ROWS = 12


def _one_step(trainer_for, batch_size, accumulation):
    model, trainer = trainer_for(batch_size, accumulation)
    trainer.train()
    return trainable_state(model), trainer.federated_history[-1]["train_loss"]


def _assert_same(a, b):
    (state_a, loss_a), (state_b, loss_b) = a, b
    assert abs(loss_a - loss_b) < 1e-6
    moved = 0
    for name in state_a:
        torch.testing.assert_close(state_b[name], state_a[name], rtol=0, atol=1e-6, msg=name)
        moved += 1
    assert moved


def test_classifier_micro_batches_give_the_union_step(tmp_path, minilm, tweets, tokenizer):
    def trainer_for(batch_size, accumulation):
        model = lora_minilm(minilm, dropout=False)
        args = config(tmp_path / f"b{batch_size}", algorithm="fedavg", num_clients=1, clients_per_round=1, num_rounds=1, local_steps=1,
                      per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                      learning_rate=0.5, max_grad_norm=0.0, partition_report=False)
        return model, tweet_trainer(model, tweets, tokenizer, args, evaluate=False,
                                    client_partitions=[list(range(ROWS))])

    union = _one_step(trainer_for, 16, 1)
    _assert_same(union, _one_step(trainer_for, 8, 2))
    _assert_same(union, _one_step(trainer_for, 4, 3))


def _causal_rows(tweets):
    """Tweets as causal-LM rows whose labels mask a prefix of varying length, so micro-batches hold different
    numbers of label tokens."""
    rows = tweets["train"].select(range(ROWS))

    def mask(row, index):
        labels = list(row["input_ids"])
        cut = 2 + 3 * (index % 4)
        return {"labels": [-100] * min(cut, len(labels) - 1) + labels[cut:]}

    return rows.map(mask, with_indices=True).remove_columns(["label"])


def test_causal_lm_micro_batches_give_the_per_token_mean_of_the_union(tmp_path, tweets, tokenizer):
    data = _causal_rows(tweets)
    counts = [sum(t != -100 for t in row["labels"][1:]) for row in data]
    assert len(set(counts)) > 1  # the micro-batches really differ in label tokens

    def trainer_for(batch_size, accumulation):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                             pad_token_id=tokenizer.pad_token_id))
        args = config(tmp_path / f"lm{batch_size}", algorithm="fedavg", num_clients=1, clients_per_round=1, num_rounds=1, local_steps=1,
                      per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                      learning_rate=0.5, max_grad_norm=0.0, partition_report=False)
        trainer = FederatedTrainer(model=model, args=args, train_dataset=data,
                                   data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100),
                                   client_partitions=[list(range(ROWS))])
        return model, trainer

    _assert_same(_one_step(trainer_for, 16, 1), _one_step(trainer_for, 8, 2))


def test_a_batch_without_a_label_token_is_a_step_that_moves_nothing(tmp_path, tokenizer):
    """G = 1: a batch whose labels are all -100 is not run (the model's mean over it is 0/0 = NaN, which excluded
    the whole client for the round). Two steps over [labelled row, label-less row] then give the model of one step
    over the labelled row, and half its loss (the round's loss is a mean over local_steps)."""
    from datasets import Dataset

    from fedhf.data.sft import SFTCollator

    from tests.helpers import tiny_llama_lora

    text = tokenizer("what a lovely day it is", add_special_tokens=False)["input_ids"]
    rows = Dataset.from_dict({"input_ids": [text, text], "attention_mask": [[1] * len(text)] * 2,
                              "labels": [text, [-100] * len(text)]})

    def run(partition, steps):
        model = tiny_llama_lora(len(tokenizer))
        args = config(tmp_path / f"steps{steps}", algorithm="fedavg", num_clients=1, clients_per_round=1,
                      num_rounds=1, local_steps=steps, per_device_train_batch_size=1, learning_rate=0.5,
                      partition_report=False, max_excluded_rounds=0)
        trainer = FederatedTrainer(model=model, args=args, train_dataset=rows, data_collator=SFTCollator(tokenizer),
                                   client_partitions=[partition])
        trainer.train()
        return trainable_state(model), trainer.federated_history[-1]

    (with_empty, log), (alone, alone_log) = run([0, 1], 2), run([0], 1)
    assert log["participants"] == 1 and log["excluded_clients"] == 0
    assert log["train_loss"] == pytest.approx(alone_log["train_loss"] / 2, rel=1e-12)
    assert any(not torch.equal(t, tiny) for t, tiny in zip(alone.values(), trainable_state(
        tiny_llama_lora(len(tokenizer))).values()))  # the labelled step trained
    for name in alone:
        torch.testing.assert_close(with_empty[name], alone[name], rtol=0, atol=0, msg=name)
