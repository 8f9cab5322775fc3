"""Shared / personal / frozen tensors (fedhf/sharing/plan.py) on a real peft LoRA MiniLM and the bundled tweets:
FedSA-LoRA's B never leaves its client and survives rounds and a checkpoint/resume, FFA-LoRA's A is the seeded
init on every client and round, a personal head is never sent; with fedavg and second-order algorithms."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorWithPadding, TrainerCallback

from fedhf import FederatedTrainer
from fedhf.core.lora import HEAD, LORA_A, LORA_B, NORM, role_of, seeded_lora_a
from fedhf.sharing.plan import STORE_NAME
from fedhf.state import load_checkpoint

from tests.helpers import config, digit_trainer, lora_minilm, tiny_resnet

ROUNDS, CLIENTS = 2, 3


class Recording(FederatedTrainer):
    """Records every client's trainable and frozen LoRA/head tensors before and after its local steps."""

    def _local_steps(self, ctx, optimizer):
        self.seen = getattr(self, "seen", [])
        before = _lora_and_head(self.model)
        loss = super()._local_steps(ctx, optimizer)
        self.seen.append((ctx.round, ctx.client_id, before, _lora_and_head(self.model)))
        return loss


class StopAfter(TrainerCallback):
    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.rounds


def _lora_and_head(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if role_of(n) in (LORA_A, LORA_B, HEAD)}


def _bytes_of(model, roles):
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if p.requires_grad and role_of(n) in roles)


def _run(minilm, tweets, tokenizer, tmp_path, trainer_class=Recording, resume=None, callbacks=None, **kw):
    model = lora_minilm(minilm, dropout=False)
    args = config(tmp_path, num_clients=CLIENTS, clients_per_round=CLIENTS, num_rounds=ROUNDS, local_steps=2,
                  learning_rate=1e-3, per_device_train_batch_size=4, partition_report=False, **kw)
    trainer = trainer_class(model=model, args=args, train_dataset=tweets["train"], callbacks=callbacks,
                            data_collator=DataCollatorWithPadding(tokenizer))
    output = trainer.train(resume_from_checkpoint=resume)
    return model, trainer, output


@pytest.mark.parametrize("algorithm", ["fedavg", "fedpac_muon"])
def test_fedsa_sends_only_a_and_head_and_each_b_persists_across_rounds(minilm, tweets, tokenizer, tmp_path, algorithm):
    model = lora_minilm(minilm, dropout=False)
    expected_per_client = _bytes_of(model, (LORA_A, HEAD))
    _, trainer, output = _run(minilm, tweets, tokenizer, tmp_path, algorithm=algorithm, parameter_sharing="fedsa",
                              save_every_rounds=ROUNDS)
    if algorithm == "fedavg":  # fedavg sends its model change only: exactly A and the head, never B
        assert output.metrics["uplink_MB"] * 2**20 == ROUNDS * CLIENTS * expected_per_client
    seen = {(r, c): (before, after) for r, c, before, after in trainer.seen}
    b_names = [n for n in seen[0, 0][0] if role_of(n) == LORA_B]
    for c in range(CLIENTS):
        for n in b_names:
            assert torch.count_nonzero(seen[0, c][0][n]) == 0  # first round: peft's init B = 0
            assert torch.count_nonzero(seen[0, c][1][n]) > 0  # trained
            assert torch.equal(seen[1, c][0][n], seen[0, c][1][n])  # round 2 starts from this client's own B
            assert torch.equal(trainer.client_store.get(c, STORE_NAME)[n], seen[1, c][1][n].float())
    assert not torch.equal(seen[0, 0][1][b_names[0]], seen[0, 1][1][b_names[0]])  # B is per client
    a_name = next(n for n in seen[0, 0][0] if role_of(n) == LORA_A)
    assert all(torch.equal(seen[1, c][0][a_name], seen[1, 0][0][a_name]) for c in range(CLIENTS))  # A is global
    # nothing of B in the run's state: no dx, Theta, control variate or server state; only the client store has it
    groups, _ = load_checkpoint(str(tmp_path / "run" / f"checkpoint-{ROUNDS}"))
    for group, tensors in groups.items():
        in_b = [k for k in tensors if "lora_B" in k]
        if group == "client_store":
            assert in_b and all(f"/{STORE_NAME}/" in k for k in in_b)
        elif group == "personal_init":  # the initial B every client starts from (never sent: clients have it)
            assert in_b and all(torch.count_nonzero(tensors[k]) == 0 for k in in_b)
        else:
            assert not in_b, (group, in_b[:3])
    assert groups["sync_state"] or groups["correction_state"] or algorithm == "fedavg"  # fedpac_muon keeps state


def test_fedsa_personal_b_is_restored_after_checkpoint_resume(minilm, tweets, tokenizer, tmp_path):
    _, whole, _ = _run(minilm, tweets, tokenizer, tmp_path / "whole", parameter_sharing="fedsa")
    kw = dict(parameter_sharing="fedsa", save_every_rounds=1)
    _run(minilm, tweets, tokenizer, tmp_path / "cut", callbacks=[StopAfter(1)], **kw)
    model, resumed, _ = _run(minilm, tweets, tokenizer, tmp_path / "cut", resume=True, **kw)
    assert [(r, c) for r, c, _, _ in resumed.seen] == [(1, c) for c in range(CLIENTS)]  # only round 2 ran
    for c in range(CLIENTS):
        mine, theirs = resumed.client_store.get(c, STORE_NAME), whole.client_store.get(c, STORE_NAME)
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    whole_model = {n: p for n, p in whole.model.named_parameters()}
    assert all(torch.equal(p, whole_model[n]) for n, p in model.named_parameters())


def test_resuming_a_finished_fedsa_run_holds_the_clients_mean_b_not_the_initial_one(minilm, tweets, tokenizer,
                                                                                     tmp_path):
    """Nothing is left to train, yet the model the resumed trainer evaluates and saves is the finished run's: its
    personal part is the clients' weighted mean B (rebuilt from the restored client store), not peft's initial B = 0."""
    kw = dict(parameter_sharing="fedsa", save_every_rounds=ROUNDS)
    finished, _, _ = _run(minilm, tweets, tokenizer, tmp_path, trainer_class=FederatedTrainer, **kw)
    model, _, output = _run(minilm, tweets, tokenizer, tmp_path, trainer_class=FederatedTrainer, resume=True, **kw)
    assert output.global_step == ROUNDS
    b_names = [n for n, _ in model.named_parameters() if role_of(n) == LORA_B]
    assert b_names and all(torch.count_nonzero(p) > 0 for n, p in finished.named_parameters() if n in b_names)
    theirs = dict(finished.named_parameters())
    assert all(torch.equal(p, theirs[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("algorithm", ["fedavg", "fadam_gt"])
def test_ffa_keeps_a_at_its_seeded_init_on_every_client_and_round(minilm, tweets, tokenizer, tmp_path, algorithm):
    model = lora_minilm(minilm, dropout=False)
    expected_per_client = _bytes_of(model, (LORA_B, HEAD))
    model, trainer, output = _run(minilm, tweets, tokenizer, tmp_path, algorithm=algorithm, parameter_sharing="ffa",
                                  seed=7)
    a_names = sorted(n for n, _ in model.named_parameters() if role_of(n) == LORA_A)
    init = {n: seeded_lora_a(dict(model.named_parameters())[n].shape, 7, i) for i, n in enumerate(a_names)}
    assert len(trainer.seen) == ROUNDS * CLIENTS
    for _, _, before, after in trainer.seen:
        assert all(torch.equal(before[n], init[n]) and torch.equal(after[n], init[n]) for n in a_names)
    assert all(not p.requires_grad for n, p in model.named_parameters() if n in init)
    b_name = next(n for n in trainer.seen[0][2] if role_of(n) == LORA_B)
    assert torch.count_nonzero(dict(model.named_parameters())[b_name]) > 0  # B is trained and averaged
    if algorithm == "fedavg":
        assert output.metrics["uplink_MB"] * 2**20 == ROUNDS * CLIENTS * expected_per_client


def test_personal_head_is_never_sent_and_stays_per_client(minilm, tweets, tokenizer, tmp_path):
    model = lora_minilm(minilm, dropout=False)
    head_init = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad and role_of(n) == HEAD}
    expected_per_client = _bytes_of(model, (LORA_A, LORA_B))
    model, trainer, output = _run(minilm, tweets, tokenizer, tmp_path, parameter_sharing="personal_head")
    assert output.metrics["uplink_MB"] * 2**20 == ROUNDS * CLIENTS * expected_per_client
    live = dict(model.named_parameters())
    stored = [trainer.client_store.get(c, STORE_NAME) for c in range(CLIENTS)]
    for n in head_init:
        assert not torch.equal(stored[0][n], head_init[n]) and not torch.equal(stored[0][n], stored[1][n])
        # the global model's head: the clients' mean (uniform client_weighting), not the untrained initial one
        mean = sum(s[n].double() for s in stored) / CLIENTS
        torch.testing.assert_close(live[n].detach().double(), mean, atol=1e-7, rtol=0)


def test_patterns_override_the_preset(minilm, tweets, tokenizer, tmp_path):
    model = lora_minilm(minilm, dropout=False)
    expected_per_client = _bytes_of(model, (LORA_A, LORA_B)) - sum(
        p.numel() * 4 for n, p in model.named_parameters() if "layer.0." in n and role_of(n) in (LORA_A, LORA_B))
    _, _, output = _run(minilm, tweets, tokenizer, tmp_path, parameter_sharing="personal_head",
                        parameter_sharing_kwargs={"frozen": [r"\.layer\.0\."]})
    assert output.metrics["uplink_MB"] * 2**20 == ROUNDS * CLIENTS * expected_per_client


def test_personal_norm_keeps_batchnorm_weights_and_statistics_per_client(digits, tmp_path):
    model = tiny_resnet()
    norm = {n for n, _ in model.named_parameters() if role_of(n) == NORM}
    stats = {n: b.clone() for n, b in model.named_buffers() if b.is_floating_point() and role_of(n) == NORM}
    assert norm and stats
    expected_per_client = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n not in norm)
    args = config(tmp_path, num_clients=CLIENTS, clients_per_round=CLIENTS, num_rounds=ROUNDS, partition="iid",
                  partition_report=False, parameter_sharing="personal_norm")
    trainer = digit_trainer(model, digits, args, evaluate=False)
    output = trainer.train()
    assert output.metrics["uplink_MB"] * 2**20 == ROUNDS * CLIENTS * expected_per_client  # no norm, no statistics
    stored = [trainer.client_store.get(c, STORE_NAME) for c in range(CLIENTS)]
    assert set(stored[0]) == norm | set(stats)
    buffers = dict(model.named_buffers())
    for n, initial in stats.items():
        assert not torch.equal(stored[0][n], stored[1][n])  # each client's own running statistics
        mean = sum(s[n].double() for s in stored) / CLIENTS  # the global model's: the clients' mean
        assert not torch.equal(buffers[n], initial)
        torch.testing.assert_close(buffers[n].double(), mean, atol=1e-6, rtol=0)
