"""Client-level DP and secure aggregation in real runs (MiniLM + LoRA on real tweets, tiny budgets): every client's
clipped message (its correction state included) has norm <= C; the noise on the sums has std sigma C; with no noise
and no clipping DP-FedAvg is FedAvg exactly; the history's epsilon is dp-accounting's, the run stops at the budget
and the card carries it; a resumed DP run is bit-identical, noise included; secure aggregation's decoded sums equal
the quantised plaintext sums for several algorithms, with a dropped client too."""

from __future__ import annotations

import math
import types

import dp_accounting
import pytest
import torch
from dp_accounting.rdp import RdpAccountant
from transformers import TrainerCallback

import fedhf.trainer.federated_trainer as federated_trainer
from fedhf import FederatedTrainer
from fedhf.core.sums import RoundSums
from fedhf.privacy import SecAggCodec
from fedhf.trainer.hooks import RoundHook
from fedhf.trainer.privacy import Privacy, full_items, protected
from fedhf.trainer.round_features import round_hooks
from tests.helpers import config, lora_minilm, trainable_state, tweet_trainer

DP = dict(dp_mode="central", dp_clip_norm=0.05)


def _run(tmp_path, minilm, tweets, tokenizer, name="run", trainer_class=None, callbacks=None, resume=None, **kw):
    kw = {"num_clients": 4, "clients_per_round": 2, "num_rounds": 2, "local_steps": 1,
          "per_device_train_batch_size": 8, "partition_report": False, "output_dir":
          str(tmp_path / name), **kw}
    args = config(tmp_path, **kw)
    model = lora_minilm(minilm, dropout=False)
    if trainer_class is None:
        trainer = tweet_trainer(model, tweets, tokenizer, args, evaluate=False, callbacks=callbacks)
    else:
        from transformers import DataCollatorWithPadding
        trainer = trainer_class(model=model, args=args, train_dataset=tweets["train"],
                                data_collator=DataCollatorWithPadding(tokenizer), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, trainable_state(model)


class _Spy(RoundHook):
    """Reads each client's messages as the sums get them (after the privacy hook)."""

    def __init__(self):
        self.seen = []

    def on_client_message(self, trainer, ctx, sent):
        items = {k: v for k, v in full_items(sent).items() if protected(k, v)}
        self.seen.append(items)
        return sent


def test_every_clipped_message_including_the_correction_state_has_norm_at_most_c(tmp_path, minilm, tweets,
                                                                                  tokenizer, monkeypatch):
    spy = _Spy()
    monkeypatch.setattr(federated_trainer, "round_hooks", lambda trainer: round_hooks(trainer) + [spy])
    _run(tmp_path, minilm, tweets, tokenizer, algorithm="scaffold", dp_noise_multiplier=0.0, **DP)
    assert len(spy.seen) == 4  # 2 clients x 2 rounds
    for items in spy.seen:
        assert any(k.startswith("correction.dc.") for k in items) and any(k.startswith("dx.") for k in items)
        norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in items.values()))
        assert norm <= 0.05
        assert norm == pytest.approx(0.05, rel=1e-9)  # these messages were larger than C: clipped to the bound
        state = math.sqrt(sum(float(v.pow(2).sum()) for k, v in items.items() if k.startswith("correction.")))
        assert 0 < state < norm  # the state is part of the clipped whole


def test_the_noise_on_a_sum_has_std_sigma_c(tmp_path):
    args = config(tmp_path, dp_mode="central", dp_clip_norm=0.7, dp_noise_multiplier=1.3)
    hook = Privacy(types.SimpleNamespace(args=args))
    sums = RoundSums()
    sums.add("dx.a", torch.zeros(40_000))
    sums.add("w", 3.0)
    sums.add("n", 3.0)
    sums.add("loss", 2.0)
    hook.after_sums(None, None, sums)
    noise = sums.get("dx.a")
    # sample std of 40,000 normals: relative std 1/sqrt(2n) = 0.35%; 2% is 5.7 of them (false failure < 1e-8)
    assert noise.std().item() == pytest.approx(1.3 * 0.7, rel=0.02)
    assert abs(noise.mean().item()) < 6 * 0.91 / 200  # 6 stds of the mean
    assert sums.scalar("w") == args.clients_per_round and math.isnan(sums.scalar("loss"))
    again = RoundSums()
    again.add("dx.a", torch.zeros(40_000))
    hook.after_sums(None, None, again)
    assert not torch.equal(again.get("dx.a"), noise)  # the stream moves on


def test_distributed_shares_sum_to_noise_of_std_sigma_c(tmp_path):
    args = config(tmp_path, num_clients=8, clients_per_round=8, dp_mode="distributed", dp_clip_norm=0.5,
                  dp_noise_multiplier=1.2, secure_aggregation=True)
    hook = Privacy(types.SimpleNamespace(args=args))
    total = sum(hook._noise_share({"dx.a": torch.zeros(40_000)}, types.SimpleNamespace(round=0, client_id=c))["dx.a"]
                for c in range(8))
    assert total.std().item() == pytest.approx(1.2 * 0.5, rel=0.02)  # 5.7 stds of the sample std, as above


def test_dp_fedavg_without_noise_or_clipping_is_fedavg_exactly(tmp_path, minilm, tweets, tokenizer):
    _, plain = _run(tmp_path, minilm, tweets, tokenizer, name="plain")
    trainer, private = _run(tmp_path, minilm, tweets, tokenizer, name="dp", dp_mode="central", dp_clip_norm=1e9,
                            dp_noise_multiplier=0.0)
    assert all(torch.equal(plain[k], private[k]) for k in plain)
    assert [h["dp_epsilon"] for h in trainer.federated_history] == [math.inf, math.inf]


def test_history_epsilon_is_dp_accounting_the_run_stops_at_budget_and_the_card_says_so(tmp_path, minilm, tweets,
                                                                                       tokenizer):
    def direct(rounds):
        accountant = RdpAccountant()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(2.0)), rounds)
        return accountant.get_epsilon(1e-3)

    budget = (direct(2) + direct(3)) / 2  # between rounds 2 and 3
    trainer, _ = _run(tmp_path, minilm, tweets, tokenizer, num_clients=8, clients_per_round=4, num_rounds=5,
                      client_sampling="poisson", dp_noise_multiplier=2.0, dp_epsilon=budget, dp_delta=1e-3,
                      dp_stop_at_budget=True, **DP)
    history = trainer.federated_history
    assert [h["round"] for h in history] == [1, 2]  # round 3 would have spent more than the budget
    assert [h["dp_epsilon"] for h in history] == [direct(1), direct(2)]
    trainer.save_model(str(tmp_path / "saved"))
    card = (tmp_path / "saved" / "README.md").read_text()
    assert f"({direct(2):.4g}, 0.001) after 2 rounds" in card and "dp-accounting RDP / Poisson, q = 4/8" in card


class _StopAt(TrainerCallback):
    def __init__(self, round_number):
        self.round_number = round_number

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.round_number:
            control.should_training_stop = True


def test_a_resumed_dp_run_is_bit_identical_noise_and_adaptive_clip_included(tmp_path, minilm, tweets, tokenizer):
    settings = dict(num_rounds=3, save_every_rounds=1, dp_noise_multiplier=0.5, dp_adaptive_clip_quantile=0.5,
                    dp_adaptive_clip_count_std=2.0, **DP)
    full, expected = _run(tmp_path, minilm, tweets, tokenizer, name="full", **settings)
    _run(tmp_path, minilm, tweets, tokenizer, name="cut", callbacks=[_StopAt(1)], **settings)
    resumed, state = _run(tmp_path, minilm, tweets, tokenizer, name="cut", resume=True, **settings)
    assert all(torch.equal(expected[k], state[k]) for k in expected)
    keep = ("round", "dp_epsilon", "dp_clip_norm", "dp_noise_multiplier", "participants")
    assert [{k: h[k] for k in keep} for h in resumed.federated_history] == \
           [{k: h[k] for k in keep} for h in full.federated_history]
    assert len({h["dp_clip_norm"] for h in full.federated_history}) > 1  # C did adapt


class _DropsClientTwo(FederatedTrainer):
    """Client 2 leaves after the round's masks were agreed (its result never arrives)."""

    def _faulty(self, loss_sum, delta):
        return "dropped" if self.local_steps_client == 2 else super()._faulty(loss_sum, delta)

    def _finish_client(self, ctx, optimizer, loss_sum, buffers, sums):
        self.local_steps_client = ctx.client_id
        super()._finish_client(ctx, optimizer, loss_sum, buffers, sums)


@pytest.mark.parametrize("algorithm", [dict(algorithm="fedavg"), dict(algorithm="scaffold"),
                                       dict(server_rule="fedsvd")], ids=["fedavg+dropout", "scaffold", "fedsvd"])
def test_secure_aggregation_decodes_to_the_quantised_plaintext_sum(tmp_path, minilm, tweets, tokenizer, monkeypatch,
                                                                   algorithm):
    settings = dict(num_rounds=1, num_clients=3, clients_per_round=3, secure_aggregation=True, secagg_range=1.0,
                    secagg_bits=16, **algorithm)
    trainer_class = _DropsClientTwo if algorithm.get("algorithm") == "fedavg" else None
    if trainer_class is not None:  # the decoded mean is the plain mean up to one quantisation step per element
        _, clear = _run(tmp_path, minilm, tweets, tokenizer, name="clear", trainer_class=trainer_class,
                        **{**settings, "secure_aggregation": False})
    masked, secure = _run(tmp_path, minilm, tweets, tokenizer, name="masked", trainer_class=trainer_class, **settings)
    monkeypatch.setattr(SecAggCodec, "mask", lambda self, encoded, *a: dict(encoded))  # plaintext quantised sums
    monkeypatch.setattr(SecAggCodec, "remove_dropped", lambda self, total, *a: dict(total))
    _, plain = _run(tmp_path, minilm, tweets, tokenizer, name="plain", trainer_class=trainer_class, **settings)
    assert all(torch.equal(secure[k], plain[k]) for k in plain)
    before = trainable_state(lora_minilm(minilm, dropout=False))
    assert any(not torch.equal(before[k], secure[k]) for k in before)  # the round did change the model
    if trainer_class is not None:
        assert masked.federated_history[-1]["excluded_clients"] == 1
        step = 2.0 / (2 ** 16 - 1)
        assert max(float((secure[k] - clear[k]).abs().max()) for k in clear) <= step


def test_a_dp_run_releases_no_per_client_statistics(tmp_path, minilm, tweets, tokenizer):
    """What the accountant does not cover is not written: no partition report (each client's sizes and label
    counts), no compression error (computed before the clip, from each client's message), no per-client rows in
    the card; the history and card that push_to_hub uploads are what is left."""
    trainer, _ = _run(tmp_path, minilm, tweets, tokenizer, num_rounds=1, partition_report=True,
                      uplink_compression="int8", dp_noise_multiplier=1.0, **DP)
    run = tmp_path / "run"
    trainer.save_model()
    assert not (run / "partition.json").exists() and not (run / "partition.png").exists()
    released = {key for entry in trainer.federated_history for key in entry}
    assert "dp_epsilon" in released and "compression_seconds" in released
    assert not any(key.startswith(("uplink_compression_rel_error", "personal_eval")) for key in released)
    card = (run / "README.md").read_text()
    assert "privacy spent (epsilon, delta)" in card
    assert "rows per client" not in card and "label skew" not in card


def test_secure_aggregation_stops_instead_of_clamping_and_sends_no_loss(tmp_path, minilm, tweets, tokenizer):
    """An element outside the codec's range would be clamped and the decoded sum silently another sum: the run
    stops naming ``secagg_range``. Within the range, the per-client loss is neither masked nor sent."""
    with pytest.raises(ValueError, match=r"outside secure aggregation's range .* set secagg_range >="):
        _run(tmp_path, minilm, tweets, tokenizer, name="narrow", num_rounds=1, secure_aggregation=True,
             secagg_range=1e-6)
    trainer, _ = _run(tmp_path, minilm, tweets, tokenizer, name="wide", num_rounds=1, secure_aggregation=True)
    assert math.isnan(trainer.federated_history[-1]["train_loss"])
