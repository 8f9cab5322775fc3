"""The LLM Trainer settings: neftune_noise_alpha and label_smoothing_factor honoured in the round loop;
group_by_length (train_sampling_strategy), optim and lr_scheduler_type refused with the fix named."""

import pytest
import torch

from fedhf import FederatedTrainer
from fedhf.data.sft import SFTCollator
from tests.helpers import config, tiny_llama_lora, trainable_state, tweet_sft

COMMON = dict(num_clients=2, clients_per_round=2, num_rounds=1, local_steps=1, algorithm="fedavg",
              learning_rate=0.5, weight_decay=0.0, partition="iid", partition_report=False)


@pytest.fixture(scope="module")
def sft(tokenizer):
    return tweet_sft(tokenizer, n_train=64, n_test=8, max_length=32)


def run(tokenizer, sft, tmp_path, **overrides):
    model = tiny_llama_lora(len(tokenizer))
    args = config(tmp_path, **{**COMMON, **overrides})
    trainer = FederatedTrainer(model=model, args=args, train_dataset=sft["train"],
                               data_collator=SFTCollator(tokenizer))
    trainer.train()
    return trainer, model


def test_neftune_noise_is_active_in_local_steps_and_removed_after(tokenizer, sft, tmp_path):
    _, plain = run(tokenizer, sft, tmp_path / "plain")
    trainer, noisy = run(tokenizer, sft, tmp_path / "noisy", neftune_noise_alpha=5.0)
    a, b = trainable_state(plain), trainable_state(noisy)
    assert max((a[n] - b[n]).abs().max().item() for n in a) > 1e-6  # the noise changed the local gradients
    embeddings = noisy.get_input_embeddings()
    assert not embeddings._forward_hooks  # the hook is gone: evaluation and saving see the clean model
    noisy.train()
    ids = torch.tensor([sft["train"][0]["input_ids"]])
    torch.testing.assert_close(embeddings(ids), embeddings.weight[ids])


def test_label_smoothing_is_the_local_loss(tokenizer, sft, tmp_path):
    # 0.5, not 0.1: at the random initial model the logits are near uniform over 30,522 tokens, so a small factor
    # moves the loss by ~1e-3 only, too close to the check below to tell smoothing from none
    trainer, _ = run(tokenizer, sft, tmp_path, label_smoothing_factor=0.5, num_clients=1, clients_per_round=1)
    # Round 1's train loss is the loss of the one local step at the initial model on the client's first batch.
    batch = next(trainer.client_data.batches(0, 0))
    model = tiny_llama_lora(len(tokenizer))
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logits, labels = logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1)
    smoothed = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.5)
    plain = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)
    assert trainer.federated_history[0]["train_loss"] == pytest.approx(smoothed.item(), rel=1e-5)
    assert abs(smoothed.item() - plain.item()) > 1e-3


@pytest.mark.parametrize("overrides, message", [
    ({"train_sampling_strategy": "group_by_length"}, "`train_sampling_strategy`='group_by_length'.*leave it 'random'"),
    ({"optim": "adafactor"}, "`optim`=.*adafactor.* is not supported.*local_optimizer"),
    ({"lr_scheduler_type": "cosine"}, "`lr_scheduler_type`=.*cosine.* is not supported.*round_lr_schedule"),
])
def test_unapplied_llm_settings_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **overrides)


def test_muons_matrix_lr_is_logged_beside_learning_rate(tokenizer, sft, tmp_path):
    """Muon's matrices (all of LoRA) step at learning_rate x muon_lr_mult: the history says so; AdamW has no such
    key."""
    muon, _ = run(tokenizer, sft, tmp_path / "muon", algorithm="local_muon", learning_rate=3e-4, num_rounds=2,
                  round_lr_schedule="cosine")
    for entry in muon.federated_history:
        assert entry["muon_matrix_lr"] == pytest.approx(entry["learning_rate"] * 100.0, rel=1e-12)
    adamw, _ = run(tokenizer, sft, tmp_path / "adamw", algorithm="local_adamw", learning_rate=3e-4)
    assert "muon_matrix_lr" not in adamw.federated_history[-1]
