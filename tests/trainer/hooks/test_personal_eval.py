"""Personalised evaluation (fedhf/trainer/hooks/personal_eval.py) on a real peft LoRA MiniLM and the bundled tweets: each client's
metric is its own model (global + its stored personal tensors) on its own held-out rows, recomputed here by hand;
for an all-shared run it is the global model per client; and training is bit-identical with and without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DataCollatorWithPadding

from fedhf.trainer.hooks.personal_eval import summarise
from fedhf.sharing.plan import STORE_NAME

from tests.helpers import config, lora_minilm, tweet_trainer

CLIENTS = 3
# FedSA-LoRA (B personal) with a personal classifier as well (FedPer-style), so that a client's own model is far
# from the global one after two short rounds.
FEDSA_PERSONAL_HEAD = dict(parameter_sharing="fedsa", parameter_sharing_kwargs={"personal": ["classifier"]})


def _train(minilm, tweets, tokenizer, tmp_path, before_train=None, **kw):
    model = lora_minilm(minilm, dropout=False)
    args = config(tmp_path, num_clients=CLIENTS, clients_per_round=CLIENTS, num_rounds=2, local_steps=2,
                  learning_rate=5e-3, per_device_train_batch_size=8, per_device_eval_batch_size=64,
                  partition="dirichlet", dirichlet_alpha=0.3, partition_report=False, client_eval_fraction=0.04,
                  **kw)
    trainer = tweet_trainer(model, tweets, tokenizer, args, evaluate=False)
    if before_train is not None:
        before_train(trainer)
    trainer.train()
    return model, trainer


def _by_hand(model, tweets, tokenizer, rows, personal=None):
    """Loss and accuracy of ``model`` (with ``personal`` tensors loaded, then put back) on the rows, in one batch."""
    live = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    saved = {n: live[n].detach().clone() for n in (personal or {})}
    with torch.no_grad():
        for n, t in (personal or {}).items():
            live[n].copy_(t)
        batch = DataCollatorWithPadding(tokenizer)([tweets["train"][int(i)] for i in rows])
        model.eval()
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"]).logits
        for n, t in saved.items():
            live[n].copy_(t)
    labels = batch["labels"]
    return {"loss": torch.nn.functional.cross_entropy(logits, labels).item(),
            "accuracy": (logits.argmax(-1) == labels).double().mean().item()}


def test_fedsa_personal_metrics_are_each_clients_own_model_and_training_is_unchanged(minilm, tweets, tokenizer,
                                                                                      tmp_path):
    model, trainer = _train(minilm, tweets, tokenizer, tmp_path / "on", personalized_eval=True, eval_every_rounds=1,
                            **FEDSA_PERSONAL_HEAD)
    held = trainer.client_eval_partitions
    assert all(0 < len(rows) <= 64 for rows in held)  # one evaluation batch each: Trainer's loss is the row mean
    hand = [_by_hand(model, tweets, tokenizer, held[c], trainer.client_store.get(c, STORE_NAME))
            for c in range(CLIENTS)]
    for c in range(CLIENTS):
        assert trainer.personal_eval_per_client[c]["loss"] == pytest.approx(hand[c]["loss"], abs=1e-5)
        assert trainer.personal_eval_per_client[c]["accuracy"] == hand[c]["accuracy"]
    # the personal tensors matter: the global model (initial B = 0 and head) on the same rows gives other losses
    glob = [_by_hand(model, tweets, tokenizer, held[c]) for c in range(CLIENTS)]
    assert all(abs(glob[c]["loss"] - hand[c]["loss"]) > 1e-4 for c in range(CLIENTS))

    losses, accuracies = np.array([h["loss"] for h in hand]), np.array([h["accuracy"] for h in hand])
    last = trainer.federated_history[-1]
    assert last["personal_eval_loss_mean"] == pytest.approx(losses.mean(), abs=1e-5)
    assert last["personal_eval_loss_worst"] == pytest.approx(losses.max(), abs=1e-5)  # the highest loss
    assert last["personal_eval_loss_std"] == pytest.approx(losses.std(), abs=1e-5)
    assert last["personal_eval_accuracy_worst"] == pytest.approx(accuracies.min())  # the lowest accuracy
    assert last["personal_eval_clients"] == CLIENTS and last["personal_eval_skipped"] == 0
    assert all("personal_eval_loss_mean" in entry for entry in trainer.federated_history)  # every round

    off_model, off = _train(minilm, tweets, tokenizer, tmp_path / "off", **FEDSA_PERSONAL_HEAD)
    assert "personal_eval_loss_mean" not in off.federated_history[-1]
    mine, theirs = dict(model.named_parameters()), dict(off_model.named_parameters())
    assert all(torch.equal(p, theirs[n]) for n, p in mine.items())  # global model bit-identical
    for c in range(CLIENTS):  # and every client's personal B and head
        a, b = trainer.client_store.get(c, STORE_NAME), off.client_store.get(c, STORE_NAME)
        assert all(torch.equal(a[n], b[n]) for n in a)


def test_all_shared_personal_mean_is_the_global_models_mean_over_clients_and_empty_clients_are_skipped(
        minilm, tweets, tokenizer, tmp_path):
    def drop_client_1(trainer):
        trainer.client_eval_partitions[1] = np.array([], dtype=np.int64)

    model, trainer = _train(minilm, tweets, tokenizer, tmp_path, before_train=drop_client_1, personalized_eval=True)
    history = trainer.federated_history
    # no eval_dataset: evaluated on the global schedule (eval_every_rounds=0: after the last round only)
    assert "personal_eval_loss_mean" not in history[0] and "personal_eval_loss_mean" in history[1]
    assert history[1]["personal_eval_clients"] == CLIENTS - 1 and history[1]["personal_eval_skipped"] == 1
    assert sorted(trainer.personal_eval_per_client) == [0, 2]
    glob = [_by_hand(model, tweets, tokenizer, trainer.client_eval_partitions[c])["loss"] for c in (0, 2)]
    assert history[1]["personal_eval_loss_mean"] == pytest.approx(np.mean(glob), abs=1e-5)


def test_summary_worst_is_highest_loss_and_lowest_other_metric():
    summary = summarise([{"loss": 1.0, "accuracy": 0.9, "perplexity": 3.0},
                         {"loss": 3.0, "accuracy": 0.5, "perplexity": 2.0}], skipped=2)
    assert summary == {"personal_eval_clients": 2, "personal_eval_skipped": 2,
                       "personal_eval_loss_mean": 2.0, "personal_eval_loss_worst": 3.0, "personal_eval_loss_std": 1.0,
                       "personal_eval_accuracy_mean": 0.7, "personal_eval_accuracy_worst": 0.5,
                       "personal_eval_accuracy_std": pytest.approx(0.2),
                       "personal_eval_perplexity_mean": 2.5, "personal_eval_perplexity_worst": 3.0,
                       "personal_eval_perplexity_std": 0.5}


def test_summary_worst_follows_each_metrics_direction():
    """mse, mae, wer are lower-is-better: their worst client is the highest (it was the lowest, the best client's).
    A name of unknown direction gets no ``_worst``; the run's ``greater_is_better`` declares it for its metric."""
    clients = [{"mse": 0.1, "mae": 0.3, "wer": 0.05, "f1": 0.8, "bananas": 1.0},
               {"mse": 2.5, "mae": 1.4, "wer": 0.6, "f1": 0.4, "bananas": 7.0}]
    summary = summarise(clients, skipped=0)
    assert (summary["personal_eval_mse_worst"], summary["personal_eval_mae_worst"],
            summary["personal_eval_wer_worst"], summary["personal_eval_f1_worst"]) == (2.5, 1.4, 0.6, 0.4)
    assert "personal_eval_bananas_worst" not in summary and summary["personal_eval_bananas_mean"] == 4.0
    from types import SimpleNamespace

    from fedhf.metrics.direction import greater_is_better

    args = SimpleNamespace(metric_for_best_model="eval_bananas", greater_is_better=True)
    declared = summarise(clients, skipped=0, greater=lambda m: greater_is_better(m, args))
    assert declared["personal_eval_bananas_worst"] == 1.0 and declared["personal_eval_mse_worst"] == 2.5
