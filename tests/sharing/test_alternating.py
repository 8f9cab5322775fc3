"""RoLoRA (fedhf/sharing/alternating.py, ``parameter_sharing="rolora"``) on a real peft LoRA MiniLM and the bundled tweets:
B alone is trained and sent in even rounds, A alone in odd ones, the frozen factor is bit-identical through its
frozen rounds on every client and on the server, the uplink counts only the trained factor (and the head), it
composes with fedavg, fedpac_muon and fadam_gt, and a correction's state of the frozen factor is kept through its
frozen round (a zero change is not a zero gradient)."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorWithPadding

from fedhf import FederatedTrainer
from fedhf.core.lora import HEAD, LORA_A, LORA_B, role_of

from tests.helpers import config, lora_minilm

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


class StateRecording(FederatedTrainer):
    """The correction's server state and the client store after every round."""

    def _run_round(self, run, params, buffers):
        entry = super()._run_round(run, params, buffers)
        self.states = getattr(self, "states", []) + [{k: v.clone() for k, v in run.correction_state.items()}]
        self.stores = getattr(self, "stores", []) + [{k: v.clone() for k, v in self.client_store.to_tensors().items()}]
        return entry


@pytest.mark.parametrize("algorithm,prefix", [("scaffold", "c."), ("fedpac_muon", "g.")])
def test_rolora_keeps_the_correction_state_of_the_frozen_factor(minilm, tweets, tokenizer, tmp_path, algorithm, prefix):
    """4 clients, 2 per round; B trains in rounds 0 and 2, A in round 1. SCAFFOLD's c_A (and each c_i,A) and
    FedPAC's global direction g_A are exactly what round 1 left after round 2, where A is frozen, so they act when
    A trains next; before, c_A was scaled by 1 - S/N and g_A was 0 in the round before A trained (FedPAC's mixing
    never acted on A)."""
    clients = 4
    args = config(tmp_path, num_clients=clients, clients_per_round=2, num_rounds=3, local_steps=1,
                  per_device_train_batch_size=4, partition_report=False, parameter_sharing="rolora",
                  algorithm=algorithm)
    trainer = StateRecording(model=lora_minilm(minilm, dropout=False), args=args, train_dataset=tweets["train"],
                             data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    states = trainer.states
    of = {role: [k for k in states[0] if role_of(k[len(prefix):]) == role] for role in (LORA_A, LORA_B)}
    assert of[LORA_A] and of[LORA_B]
    for frozen_round, role in ((2, LORA_A), (1, LORA_B)):
        before, after = states[frozen_round - 1], states[frozen_round]
        assert all(torch.equal(after[k], before[k]) for k in of[role])  # kept through the frozen round
        assert sum(before[k].abs().sum().item() for k in of[role]) > 0  # and it is the trained round's, not zero
    assert any(not torch.equal(states[2][k], states[1][k]) for k in of[LORA_B])  # B's moves on when B trains
    if algorithm == "scaffold":  # each client's c_i of A is kept too, and c is still the mean of all N c_i
        a_entries = [k for k in trainer.stores[1] if role_of(k.rsplit("/", 1)[1]) == LORA_A]
        assert a_entries and all(torch.equal(trainer.stores[2][k], trainer.stores[1][k]) for k in a_entries)
        final = trainer.stores[-1]
        for key in states[-1]:
            name = key[len(prefix):]
            total = sum(t for k, t in final.items() if k.endswith(f"/scaffold_c/{name}"))
            torch.testing.assert_close(states[-1][key], total / clients, rtol=1e-5, atol=1e-9)
