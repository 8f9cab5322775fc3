"""FedEx-LoRA (fedhf/server/lora.py) on a real peft LoRA Llama with non-square adapted layers: after a round the
global effective weight W + (alpha/r) B A is the mean of the clients' effective weights (with plain FedAvg it is
not), what it sends is counted, resume is exact, and it composes with fedavg, fedpac_muon and fadam_gt (the rules
that re-factorise A and B refuse the stateful ones)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import TrainerCallback

from fedhf import FederatedTrainer
from fedhf.data.demo import tiny_llama
from fedhf.runtime.lora_layers import lora_layers
from fedhf.data.sft import SFTCollator

from tests.helpers import config, tweet_sft

CLIENTS = 3


@pytest.fixture(scope="module")
def sft(tokenizer):
    return tweet_sft(tokenizer, n_train=48, n_test=8, max_length=24)


def lora_llama(vocab_size, rank=4):
    # up_proj is 128 x 64, down_proj 64 x 128: no adapted layer is square, so a transpose would not even run.
    model = tiny_llama(vocab_size)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=["up_proj", "down_proj"],
                      task_type=TaskType.CAUSAL_LM)
    return get_peft_model(model, lora)


def effective_weights(model):
    """W + s B A per adapted layer, from peft itself (get_delta_weight applies its own scale)."""
    return {name: (m.get_base_layer().weight + m.get_delta_weight("default")).detach().double().clone()
            for name, m in model.named_modules() if isinstance(m, LoraLayer)}


class Recording(FederatedTrainer):
    def _local_steps(self, ctx, optimizer):
        loss = super()._local_steps(ctx, optimizer)
        self.clients = getattr(self, "clients", []) + [(ctx.round, effective_weights(self.model))]
        a_after = {layer.a: self.plan.params[layer.a].detach().clone() for layer in lora_layers(self.model).values()}
        self.a_seen = getattr(self, "a_seen", []) + [(ctx.round, a_after)]
        return loss


class StopAfter(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= 1


def run(tokenizer, sft, tmp_path, rounds=1, resume=None, callbacks=None, rank=4, **kw):
    model = lora_llama(len(tokenizer), rank)
    args = config(tmp_path, num_clients=CLIENTS, clients_per_round=CLIENTS, num_rounds=rounds, local_steps=3,
                  per_device_train_batch_size=4, partition="iid", partition_report=False,
                  **{"local_optimizer": "adamw", "learning_rate": 1e-2, **kw})
    trainer = Recording(model=model, args=args, train_dataset=sft["train"], data_collator=SFTCollator(tokenizer),
                        callbacks=callbacks)
    output = trainer.train(resume_from_checkpoint=resume)
    return model, trainer, output


def gap_to_client_mean(model, trainer):
    clients = [w for r, w in trainer.clients if r == 0]
    mean = {n: sum(c[n] for c in clients) / len(clients) for n in clients[0]}
    glob = effective_weights(model)
    return max((glob[n] - mean[n]).abs().max().item() for n in mean)


# FlexLoRA is exact at full rank: r = 64 = min(out, in) of every adapted layer; FedSVD at any rank (A is common).
@pytest.mark.parametrize("rule,rank", [("fedex_lora", 4), ("flora", 4), ("flexlora", 64), ("fedsvd", 4)])
def test_global_effective_weight_is_the_mean_of_the_clients(tokenizer, sft, tmp_path, rule, rank):
    model, trainer, _ = run(tokenizer, sft, tmp_path / rule, rank=rank, server_rule=rule)
    assert all(m.get_base_layer().weight.shape[0] != m.get_base_layer().weight.shape[1]
               for m in model.modules() if isinstance(m, LoraLayer))
    assert gap_to_client_mean(model, trainer) < 1e-5


@pytest.mark.parametrize("rank", [4, 64])
def test_naive_averaging_of_a_and_b_misses_the_mean(tokenizer, sft, tmp_path, rank):
    naive, naive_trainer, _ = run(tokenizer, sft, tmp_path, rank=rank, server_rule="mean")
    assert gap_to_client_mean(naive, naive_trainer) > 1e-4  # averaging A and B is not averaging B A


def test_fedex_uploads_the_factors_and_downloads_the_residual(tokenizer, sft, tmp_path):
    model, _, output = run(tokenizer, sft, tmp_path, rounds=2, server_rule="fedex_lora")
    layers, live = lora_layers(model).values(), dict(model.named_parameters())
    adapter = sum(live[n].numel() * 4 for n, p in live.items() if p.requires_grad)
    product = sum(live[layer.base].numel() * 4 for layer in layers)  # B A is (out x in), fp32
    assert output.metrics["uplink_MB"] * 2**20 == 2 * CLIENTS * adapter  # the server forms B_i A_i from dA, dB
    assert output.metrics["downlink_MB"] * 2**20 == 2 * CLIENTS * adapter + CLIENTS * product  # residual: round 2


def test_fedex_resume_restores_the_folded_base_weights(tokenizer, sft, tmp_path):
    whole, _, _ = run(tokenizer, sft, tmp_path / "whole", rounds=2, server_rule="fedex_lora")
    kw = dict(rounds=2, server_rule="fedex_lora", save_every_rounds=1)
    run(tokenizer, sft, tmp_path / "cut", callbacks=[StopAfter()], **kw)
    resumed, _, _ = run(tokenizer, sft, tmp_path / "cut", resume=True, **kw)
    reference = dict(whole.named_parameters())
    changed = [layer.base for layer in lora_layers(whole).values()]
    fresh = dict(lora_llama(len(tokenizer)).named_parameters())
    assert all(not torch.equal(reference[n], fresh[n]) for n in changed)  # the base weights did change
    assert all(torch.equal(p, reference[n]) for n, p in resumed.named_parameters())


REFACTORISING = ["flora", "flexlora", "fedsvd"]


# fedpac_muon (global direction g_G, averaged momentum) and fadam_gt (tracking y, y_i, persisted v_hat) keep state
# in A/B coordinates; only fedex_lora keeps the averaged A and B, the other rules rebuild them every round.
@pytest.mark.parametrize("algorithm,rule", [("fedavg", rule) for rule in ["fedex_lora"] + REFACTORISING]
                         + [("fedpac_muon", "fedex_lora"), ("fadam_gt", "fedex_lora")])
def test_lora_rules_compose_with_second_order_algorithms(tokenizer, sft, tmp_path, algorithm, rule):
    fedavg = {"local_optimizer": "adamw", "learning_rate": 1e-2} if algorithm == "fedavg" else {}
    model, trainer, output = run(tokenizer, sft, tmp_path, rounds=2, algorithm=algorithm, server_rule=rule,
                                 **{"local_optimizer": None, "learning_rate": None, **fedavg})
    assert output.metrics["rounds"] == 2 and torch.isfinite(torch.tensor(output.metrics["train_loss"]))
    if rule == "flexlora":  # rank 4 < rank of the mean product: the best rank-4 approximation, not exact
        return
    clients = [w for r, w in trainer.clients if r == 1]
    mean = {n: sum(c[n] for c in clients) / len(clients) for n in clients[0]}
    glob = effective_weights(model)
    assert max((glob[n] - mean[n]).abs().max().item() for n in mean) < 1e-5


@pytest.mark.parametrize("rule", REFACTORISING)
@pytest.mark.parametrize("algorithm,axes,named", [
    ("fedpac_muon", {}, "correction 'global_mix'"),  # refused on its correction first
    ("fadam_gt", {}, "correction 'parameter_tracking'"),
    ("scaffold", {}, "correction 'control_variate'"),
    ("fedavg", {"local_optimizer": "amsgrad", "state_sync": "persist_local"}, "state_sync='persist_local'"),
    ("fedavg", {"local_optimizer": "amsgrad", "state_sync": "average_warmstart"}, "state_sync='average_warmstart'")])
def test_refactorising_rules_refuse_state_kept_in_the_old_basis(tmp_path, rule, algorithm, axes, named):
    common = dict(num_clients=CLIENTS, clients_per_round=CLIENTS, algorithm=algorithm)
    with pytest.raises(ValueError, match="new basis every round") as err:
        config(tmp_path, server_rule=rule, **common, **axes)
    assert named in str(err.value) and "fedex_lora" in str(err.value)
    config(tmp_path, server_rule="fedex_lora", **common, **axes)  # the named fix
    config(tmp_path, server_rule=rule, **common, **{**axes, "correction": "proximal", "state_sync": "reset"})  # or none


def test_fedsvd_clients_train_only_b_and_the_server_makes_a_orthonormal(tokenizer, sft, tmp_path):
    model, trainer, output = run(tokenizer, sft, tmp_path, rounds=2, server_rule="fedsvd")
    layers, live = lora_layers(model).values(), dict(model.named_parameters())
    for layer in layers:  # A' = the first r rows of V^T: orthonormal rows
        a = live[layer.a].detach().double()
        torch.testing.assert_close(a @ a.T, torch.eye(a.shape[0], dtype=torch.float64), atol=1e-5, rtol=0)
    # A is never trained: after its local steps every client of a round holds that round's global A
    first = {r: seen for r, seen in reversed(trainer.a_seen)}
    assert len(trainer.a_seen) == 2 * CLIENTS
    assert all(torch.equal(seen[n], first[r][n]) for r, seen in trainer.a_seen for n in seen)
    assert not any(torch.equal(first[0][n], first[1][n]) for n in first[0])  # the server re-factorised it
    b_bytes = sum(live[layer.b].numel() * 4 for layer in layers)
    assert output.metrics["uplink_MB"] * 2**20 == 2 * CLIENTS * b_bytes  # dB only: no dA, no product


def _flora_a(seed: int, round_index: int) -> torch.Tensor:
    from fedhf.core.sums import RoundSums
    from fedhf.core.context import ServerContext
    from fedhf.server.lora import FLoRA

    x = {"l.lora_A.default.weight": torch.zeros(4, 16), "l.lora_B.default.weight": torch.zeros(8, 4)}
    ctx = ServerContext(round=round_index, round_lr=1.0, local_steps=1, num_clients=2, sums=RoundSums(),
                        global_params=x, mean_delta={k: torch.zeros_like(v) for k, v in x.items()}, seed=seed)
    return FLoRA().aggregate(ctx)["l.lora_A.default.weight"]


def test_flora_draws_each_round_a_from_the_run_seed():
    assert torch.equal(_flora_a(0, 1), _flora_a(0, 1))  # every client and process rebuilds the same A
    assert not torch.equal(_flora_a(0, 1), _flora_a(1, 1))  # another seed, another sequence of A
    assert not torch.equal(_flora_a(0, 1), _flora_a(0, 2))
    assert _flora_a(3, 0).abs().max() <= 1 / 4  # peft's Kaiming-uniform bound 1/sqrt(in), in = 16
