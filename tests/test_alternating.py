"""RoLoRA (fedhf/alternating.py, ``parameter_sharing="rolora"``) on a real peft LoRA MiniLM and the bundled tweets:
B alone is trained and sent in even rounds, A alone in odd ones, the frozen factor is bit-identical through its
frozen rounds on every client and on the server, the uplink counts only the trained factor (and the head), and it
composes with fedavg, fedpac_muon and fadam_gt."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorWithPadding

from fedhf import FederatedTrainer
from fedhf.lora import HEAD, LORA_A, LORA_B, role_of

from .helpers import config, lora_minilm

ROUNDS, CLIENTS = 3, 2


class Recording(FederatedTrainer):
    """Every client's LoRA and head tensors before and after its local steps, and the global ones after a round."""

    def _local_steps(self, ctx, optimizer):
        self.seen = getattr(self, "seen", [])
        before = _tensors(self.model)
        loss = super()._local_steps(ctx, optimizer)
        self.seen.append((ctx.round, before, _tensors(self.model)))
        return loss

    def _run_round(self, run, params, buffers):
        entry = super()._run_round(run, params, buffers)
        self.globals = getattr(self, "globals", []) + [_tensors(self.model)]
        return entry


def _tensors(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if role_of(n) in (LORA_A, LORA_B, HEAD)}


def _bytes(model, roles):
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if p.requires_grad and role_of(n) in roles)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedpac_muon", "fadam_gt"])
def test_rolora_trains_and_sends_one_factor_per_round(minilm, tweets, tokenizer, tmp_path, algorithm):
    model = lora_minilm(minilm, dropout=False)
    initial = _tensors(model)
    sent = {0: _bytes(model, (LORA_B, HEAD)), 1: _bytes(model, (LORA_A, HEAD))}
    args = config(tmp_path, num_clients=CLIENTS, clients_per_round=CLIENTS, num_rounds=ROUNDS, local_steps=2,
                  per_device_train_batch_size=4, partition_report=False, parameter_sharing="rolora",
                  algorithm=algorithm, **({"learning_rate": 1e-3} if algorithm == "fedavg" else {}))
    trainer = Recording(model=model, args=args, train_dataset=tweets["train"],
                        data_collator=DataCollatorWithPadding(tokenizer))
    output = trainer.train()
    names = {role: [n for n in initial if role_of(n) == role] for role in (LORA_A, LORA_B)}
    assert len(trainer.seen) == ROUNDS * CLIENTS
    for r, before, after in trainer.seen:
        frozen, trained = (LORA_A, LORA_B) if r % 2 == 0 else (LORA_B, LORA_A)
        assert all(torch.equal(before[n], after[n]) for n in names[frozen])  # frozen on every client
        assert any(not torch.equal(before[n], after[n]) for n in names[trained])  # the other factor learns
    previous = initial
    for r, glob in enumerate(trainer.globals):
        frozen, trained = (LORA_A, LORA_B) if r % 2 == 0 else (LORA_B, LORA_A)
        assert all(torch.equal(glob[n], previous[n]) for n in names[frozen])  # and on the server
        assert any(not torch.equal(glob[n], previous[n]) for n in names[trained])
        previous = glob
    assert all(p.requires_grad for n, p in model.named_parameters() if n in names[LORA_A] + names[LORA_B])
    if algorithm == "fedavg":  # fedavg sends its model change only: the trained factor and the head
        expected = CLIENTS * sum(sent[r % 2] for r in range(ROUNDS))
        assert output.metrics["uplink_MB"] * 2**20 == expected
        assert expected < ROUNDS * CLIENTS * _bytes(model, (LORA_A, LORA_B, HEAD))  # less than all of it
