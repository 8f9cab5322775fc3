"""gradient_accumulation_steps: batch B x G=1 and batch B/G x G give the same update (SGD, no dropout), with the
per-row mean for a classifier and the per-token mean for a causal LM whose micro-batches hold different numbers
of completion tokens."""

import datasets
import torch

from fedhf import FederatedTrainer
from fedhf.data.bundled import load_tweet_instructions, subsample
from fedhf.data.sft import SFTCollator, tokenize_sft
from fedhf.accumulation import count_items
from tests.helpers import config, lora_minilm, tiny_llama_lora, trainable_state, tweet_trainer

COMMON = dict(num_clients=2, clients_per_round=2, num_rounds=1, local_steps=2, algorithm="fedavg",
              learning_rate=0.5, weight_decay=0.0, max_grad_norm=0.0, partition="iid", partition_report=False)


def assert_same(a, b, atol):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


def test_minilm_lora_batch16_equals_batch8_times_2(minilm, tweets, tokenizer, tmp_path):
    states = []
    for batch, accumulate in ((16, 1), (8, 2)):
        model = lora_minilm(minilm, dropout=False)
        args = config(tmp_path / f"b{batch}", per_device_train_batch_size=batch,
                      gradient_accumulation_steps=accumulate, **COMMON)
        tweet_trainer(model, tweets, tokenizer, args, evaluate=False).train()
        states.append(trainable_state(model))
    initial = trainable_state(lora_minilm(minilm, dropout=False))
    assert any((states[0][n] - initial[n]).abs().max() > 1e-3 for n in initial)  # it did train
    assert_same(states[0], states[1], atol=1e-6)


def varied_completions(tokenizer, n=64):
    """Tweets whose completions carry 1 to 6 tokens (the answer, then some of the tweet's words), so equally
    weighted micro-batch means would differ from the union's per-token mean."""
    rows = subsample(load_tweet_instructions()["train"], n)
    completion = [c + "".join(" " + w for w in p.split()[1:1 + i % 6]) for i, (p, c) in
                  enumerate(zip(rows["prompt"], rows["completion"]))]
    rows = datasets.Dataset.from_dict({"prompt": rows["prompt"], "completion": completion, "label": rows["label"]})
    return tokenize_sft(rows, tokenizer, max_length=40)


def test_tiny_llama_per_token_mean_over_the_union(tokenizer, tmp_path):
    data = varied_completions(tokenizer)
    collator = SFTCollator(tokenizer)
    states, trainers = [], []
    for batch, accumulate in ((16, 1), (8, 2)):
        model = tiny_llama_lora(len(tokenizer))
        args = config(tmp_path / f"b{batch}", per_device_train_batch_size=batch,
                      gradient_accumulation_steps=accumulate, **COMMON)
        trainer = FederatedTrainer(model=model, args=args, train_dataset=data, data_collator=collator)
        trainer.train()
        states.append(trainable_state(model))
        trainers.append(trainer)
    # The two micro-batches of a step really hold different numbers of completion tokens.
    trainer = trainers[1]
    trainer._train_data, trainer._collator = trainer._client_data_pipeline()
    stream = trainer._client_batches(0, 0)
    first, second = next(stream), next(stream)
    assert count_items(first, True) != count_items(second, True)
    initial = trainable_state(tiny_llama_lora(len(tokenizer)))
    assert any((states[0][n] - initial[n]).abs().max() > 1e-4 for n in initial)
    assert_same(states[0], states[1], atol=1e-6)


def test_count_items_rows_or_shifted_tokens():
    labels = torch.tensor([[5, -100, 7], [-100, 8, -100]])
    assert count_items({"labels": labels}, loss_shifts_labels=True) == 2  # position 0 is never a target
    assert count_items({"labels": labels}, loss_shifts_labels=False) == 3
    assert count_items({"labels": torch.tensor([0, 2, 1])}, loss_shifts_labels=False) == 3
