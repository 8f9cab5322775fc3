"""Known equivalences, checked on the real model and data (pretrained MiniLM + LoRA on tweets)."""

from __future__ import annotations

import torch
from transformers import DataCollatorWithPadding

from fedhf.core.params import trainable_parameters

from tests.helpers import config, lora_minilm, trainable_state, tweet_trainer


def _run(minilm, tweets, tokenizer, tmp_path, name, partitions=None, **overrides):
    model = lora_minilm(minilm, dropout=False)
    args = config(tmp_path / name, **overrides)
    trainer = tweet_trainer(model, tweets, tokenizer, args, evaluate=False, client_partitions=partitions)
    trainer.train()
    return trainable_state(model)


def _assert_close(a, b, atol):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-4, msg=name)


def test_fedavg_one_client_one_step_is_one_centralised_sgd_step(minilm, tweets, tokenizer, tmp_path):
    rows = list(range(16))
    lr, wd, clip = 0.5, 1e-3, 1.0
    fed = _run(minilm, tweets, tokenizer, tmp_path, "fed", partitions=[rows], num_clients=1, clients_per_round=1,
               num_rounds=1, local_steps=1, algorithm="fedavg", learning_rate=lr, weight_decay=wd, max_grad_norm=clip)

    model = lora_minilm(minilm, dropout=False)
    model.train()
    params = trainable_parameters(model)
    before = trainable_state(model)
    train = tweets["train"].select(rows)
    batch = DataCollatorWithPadding(tokenizer)([train[i] for i in range(len(rows))])
    optimizer = torch.optim.SGD(params.values(), lr=lr, weight_decay=wd)
    model(**batch).loss.backward()
    torch.nn.utils.clip_grad_norm_(params.values(), clip)
    optimizer.step()
    central = trainable_state(model)

    assert any(not torch.equal(before[n], central[n]) for n in central)  # the step did something
    _assert_close(fed, central, atol=1e-6)


def test_scaffold_with_identical_clients_equals_fedavg(minilm, tweets, tokenizer, tmp_path):
    rows = list(range(12))
    same = [rows] * 3  # every client holds the same data; one batch = all of it, so gradients agree
    common = dict(num_clients=3, clients_per_round=3, num_rounds=3, local_steps=3, per_device_train_batch_size=12,
                  learning_rate=0.5)
    scaffold = _run(minilm, tweets, tokenizer, tmp_path, "scaffold", same, algorithm="scaffold", **common)
    fedavg = _run(minilm, tweets, tokenizer, tmp_path, "fedavg", same, algorithm="fedavg", **common)
    _assert_close(scaffold, fedavg, atol=1e-5)


def test_scaffold_differs_from_fedavg_on_skewed_clients(minilm, tweets, tokenizer, tmp_path):
    common = dict(num_clients=3, clients_per_round=3, num_rounds=2, local_steps=2, dirichlet_alpha=0.1,
                  learning_rate=0.5, min_partition_size=16, per_device_train_batch_size=8)
    scaffold = _run(minilm, tweets, tokenizer, tmp_path, "scaffold", algorithm="scaffold", **common)
    fedavg = _run(minilm, tweets, tokenizer, tmp_path, "fedavg", algorithm="fedavg", **common)
    gap = max((scaffold[n] - fedavg[n]).abs().max().item() for n in fedavg)
    assert gap > 1e-4  # the correction is real (the reference code's SCAFFOLD has no effect)


def test_fedprox_with_mu_zero_equals_fedavg(minilm, tweets, tokenizer, tmp_path):
    common = dict(num_clients=4, clients_per_round=2, num_rounds=2, local_steps=2, learning_rate=0.3,
                  per_device_train_batch_size=8)
    prox = _run(minilm, tweets, tokenizer, tmp_path, "prox", algorithm="fedprox", algorithm_kwargs={"mu": 0.0}, **common)
    fedavg = _run(minilm, tweets, tokenizer, tmp_path, "fedavg", algorithm="fedavg", **common)
    _assert_close(prox, fedavg, atol=0.0)
    strong = _run(minilm, tweets, tokenizer, tmp_path, "strong", algorithm="fedprox", algorithm_kwargs={"mu": 1.0},
                  **common)
    assert max((strong[n] - fedavg[n]).abs().max().item() for n in fedavg) > 1e-5
