"""Heterogeneous LoRA ranks per client (fedhf/sharing/client_ranks.py) on a real peft LoRA Llama with non-square layers:
equal ranks change nothing (bit for bit), and with mixed ranks each client's adapter B_i A_i has rank <= r_i while
FLoRA's global effective weight stays the exact mean of the clients'; SCAFFOLD averages each rank component over
the clients that train it, and an averaged optimizer state is refused."""

from __future__ import annotations

import pytest
import torch

from fedhf import FederatedTrainer
from fedhf.data.sft import SFTCollator
from fedhf.runtime.lora_layers import lora_layers

from tests.helpers import config, tweet_sft
from tests.server.test_lora import CLIENTS, effective_weights, lora_llama

RANK = 4


@pytest.fixture(scope="module")
def sft(tokenizer):
    return tweet_sft(tokenizer, n_train=48, n_test=8, max_length=24)


class Recording(FederatedTrainer):
    """Each client's A, B and effective weights after its local steps."""

    def _local_steps(self, ctx, optimizer):
        loss = super()._local_steps(ctx, optimizer)
        live = dict(self.model.named_parameters())
        adapters = {layer.a: (live[layer.a].detach().clone(), live[layer.b].detach().clone())
                    for layer in lora_layers(self.model).values()}
        self.seen = getattr(self, "seen", []) + [(ctx.round, ctx.client_id, adapters, effective_weights(self.model))]
        return loss


class StateRecording(Recording):
    """Also the round's local lr and the correction's server state after each round."""

    def _local_steps(self, ctx, optimizer):
        self.local_lr = ctx.local_lr
        return super()._local_steps(ctx, optimizer)

    def _run_round(self, run, params, buffers):
        entry = super()._run_round(run, params, buffers)
        self.correction_state = {k: v.clone() for k, v in run.correction_state.items()}
        return entry


def _run(tokenizer, sft, tmp_path, trainer_class=None, **kw):
    model = lora_llama(len(tokenizer), RANK)
    args = config(tmp_path, num_clients=CLIENTS, clients_per_round=CLIENTS, local_steps=3,
                  per_device_train_batch_size=4, partition="iid", partition_report=False,
                  **{"num_rounds": 1, "local_optimizer": "adamw", "learning_rate": 1e-2, **kw})
    trainer = (trainer_class or Recording)(model=model, args=args, train_dataset=sft["train"],
                                           data_collator=SFTCollator(tokenizer))
    trainer.train()
    return model, trainer


def test_equal_ranks_are_todays_flexlora_bit_for_bit(tokenizer, sft, tmp_path):
    plain, _ = _run(tokenizer, sft, tmp_path / "plain", server_rule="flexlora")
    ranked, _ = _run(tokenizer, sft, tmp_path / "ranked", server_rule="flexlora", lora_client_ranks=[RANK] * CLIENTS)
    theirs = dict(plain.named_parameters())
    assert all(torch.equal(p, theirs[n]) for n, p in ranked.named_parameters())


@pytest.mark.parametrize("rule", ["flexlora", "flora"])
def test_mixed_ranks_give_each_client_an_adapter_of_its_rank(tokenizer, sft, tmp_path, rule):
    ranks = [1, 2, RANK]
    model, trainer = _run(tokenizer, sft, tmp_path, server_rule=rule, lora_client_ranks=ranks)
    assert len(trainer.seen) == CLIENTS
    for _, client, adapters, _ in trainer.seen:
        r = ranks[client]
        for a, b in adapters.values():
            assert torch.count_nonzero(a[r:]) == 0 and torch.count_nonzero(b[:, r:]) == 0
            assert torch.count_nonzero(b[:, :r]) > 0  # the client's own components did train
            assert torch.linalg.matrix_rank(b.double() @ a.double()) <= r
    if rule == "flora":  # stacking mixed ranks keeps the global effective weight the exact mean of the clients'
        clients = [w for _, _, _, w in trainer.seen]
        mean = {n: sum(c[n] for c in clients) / len(clients) for n in clients[0]}
        glob = effective_weights(model)
        assert max((glob[n] - mean[n]).abs().max().item() for n in mean) < 1e-5


def test_personalised_evaluation_of_a_client_uses_its_rank(tokenizer, sft, tmp_path):
    ranks = [1, 2, RANK]
    # FlexLoRA: the global adapter after the round is non-zero, so cutting it to a rank changes the model
    model, trainer = _run(tokenizer, sft, tmp_path, server_rule="flexlora", lora_client_ranks=ranks,
                          personalized_eval=True, client_eval_fraction=0.2, per_device_eval_batch_size=64)
    live = dict(model.named_parameters())
    pairs = [(live[layer.a], live[layer.b]) for layer in lora_layers(model).values()]
    model.eval()

    def loss_on(rows):
        batch = SFTCollator(tokenizer)([sft["train"][int(i)] for i in rows])
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     labels=batch["labels"]).loss.item()

    for client, rows in enumerate(trainer.client_eval_partitions):
        saved = [(a.detach().clone(), b.detach().clone()) for a, b in pairs]
        with torch.no_grad():
            uncut = loss_on(rows)
            for a, b in pairs:  # the global adapter cut to the client's rank, by hand
                a[ranks[client]:].zero_()
                b[:, ranks[client]:].zero_()
            loss = loss_on(rows)
            for (a, b), (a0, b0) in zip(pairs, saved):
                a.copy_(a0)
                b.copy_(b0)
        assert trainer.personal_eval_per_client[client]["loss"] == pytest.approx(loss, abs=1e-5)
        assert (abs(uncut - loss) > 1e-5) == (ranks[client] < RANK)  # the cut matters below the full rank


# fedpac_muon's averaged momentum is refused with mixed ranks (below); its mixing runs with the state reset
@pytest.mark.parametrize("algorithm,kw", [("fadam_gt", {}), ("fedpac_muon", {"state_sync": "reset"})])
def test_mixed_ranks_compose_with_second_order_algorithms(tokenizer, sft, tmp_path, algorithm, kw):
    ranks = [1, 2, RANK]  # FedPAC's after-step mixing and FAdamGT's tracking cannot revive the cut components
    _, trainer = _run(tokenizer, sft, tmp_path, server_rule="fedex_lora", lora_client_ranks=ranks, num_rounds=2,
                      algorithm=algorithm, local_optimizer=None, learning_rate=None, **kw)  # flexlora refuses state
    assert len(trainer.seen) == 2 * CLIENTS
    for _, client, adapters, _ in trainer.seen:
        for a, b in adapters.values():
            assert torch.count_nonzero(a[ranks[client]:]) == 0 and torch.count_nonzero(b[:, ranks[client]:]) == 0
    assert all(torch.isfinite(torch.tensor(e["train_loss"])) for e in trainer.federated_history)


def test_scaffold_averages_each_component_over_the_clients_that_train_it(tokenizer, sft, tmp_path):
    """ranks [1, 4, 4], one round of SCAFFOLD (c = c_i = 0 before it): c on component 0 is the mean of the three
    clients' (x^r - x_i^K) / (K eta), on components 1..3 the mean of the two full-rank clients' only. Before, the
    rank-1 client's zeroing entered c as (x^r - 0) / (K eta), thousands of times the gradient scale."""
    ranks, steps = [1, RANK, RANK], 3
    initial = {n: p.detach().clone() for n, p in lora_llama(len(tokenizer), RANK).named_parameters()}
    _, trainer = _run(tokenizer, sft, tmp_path, trainer_class=StateRecording, server_rule="fedex_lora",
                      lora_client_ranks=ranks, algorithm="scaffold", local_optimizer=None, learning_rate=None)
    scale = 1.0 / (steps * trainer.local_lr)
    finals = {client: adapters for _, client, adapters, _ in trainer.seen}
    c = trainer.correction_state
    for a_name in finals[0]:
        b_name = a_name.replace("lora_A", "lora_B")
        for name, index, cut in ((a_name, 0, lambda t, j: t[j]), (b_name, 1, lambda t, j: t[:, j])):
            estimates = {i: (initial[name] - finals[i][a_name][index]) * scale for i in finals}  # (x^r - x_i^K)/(K eta)
            torch.testing.assert_close(cut(c[f"c.{name}"], 0), sum(cut(e, 0) for e in estimates.values()) / 3,
                                       rtol=1e-4, atol=1e-9)
            full_rank_mean = (cut(estimates[1], slice(1, None)) + cut(estimates[2], slice(1, None))) / 2
            torch.testing.assert_close(cut(c[f"c.{name}"], slice(1, None)), full_rank_mean, rtol=1e-4, atol=1e-9)
    b_names = [n for n in c if "lora_B" in n]
    assert any(c[n][:, 1:].abs().sum() > 0 for n in b_names)  # B's high components did learn (non-trivial check)


def test_mixed_ranks_refuse_an_averaged_optimizer_state(tokenizer, sft, tmp_path):
    """FedPAC_Muon averages the clients' momentum: a rank-1 client's is zero on the components it lacks."""
    model = lora_llama(len(tokenizer), RANK)
    args = config(tmp_path, num_clients=CLIENTS, clients_per_round=CLIENTS, server_rule="fedex_lora",
                  lora_client_ranks=[1, RANK, RANK], algorithm="fedpac_muon")
    with pytest.raises(ValueError, match="state_sync='average_warmstart'.*persist_local"):
        FederatedTrainer(model=model, args=args, train_dataset=sft["train"], data_collator=SFTCollator(tokenizer))


def test_masks_and_counts_live_on_the_parameters_device():
    """On a GPU the corrections multiply and divide the parameters' sums by these (r, 1)/(1, r) tensors, and a CUDA
    op takes no CPU tensor of that shape: they are built where the parameters are (here the meta device)."""
    from fedhf.sharing.client_ranks import ClientRanks

    a, b = "layer.lora_A.default.weight", "layer.lora_B.default.weight"
    params = {a: torch.nn.Parameter(torch.empty(4, 8, device="meta")),
              b: torch.nn.Parameter(torch.empty(8, 4, device="meta"))}
    ranks = ClientRanks([2, 4], params)
    tensors = [*ranks.masks(0).values(), *ranks.masks(1).values(), *ranks.trainers().values()]
    assert len(tensors) == 6 and all(t.device.type == "meta" for t in tensors)
    assert ranks.masks(0)[a].shape == (4, 1) and ranks.trainers()[b].shape == (1, 4)
