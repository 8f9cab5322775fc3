"""Client-level DP and secure aggregation in real runs (MiniLM + LoRA on real tweets, tiny budgets): every client's
clipped message (its correction state included) has norm <= C; the noise on the sums has std sigma C and follows
the run's secret, not its seed; an empty Poisson round is noised too; with no noise and no clipping DP-FedAvg is
FedAvg exactly; the history's epsilon is dp-accounting's, the run stops at the budget (a resume included) and the
card carries it; distributed DP withholds a round with too few survivors and reports the epsilon against the
server; a resumed DP run is bit-identical, noise included; secure aggregation's decoded sums equal the quantised
plaintext sums for several algorithms, with a dropped client too."""

from __future__ import annotations

import math
import os
import types

import dp_accounting
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

import fedhf.trainer.federated_trainer as federated_trainer
from fedhf import FederatedTrainer
import fedhf.trainer.hooks.privacy as privacy_hook
from fedhf.core.client_store import ClientStateStore
from fedhf.core.message import Message
from fedhf.core.schedule import round_clients, stream_seed
from fedhf.core.sums import RoundSums
from fedhf.privacy import SecAggCodec
from fedhf.trainer.hooks.base import ClientMessages, RoundHook
from fedhf.trainer.hooks.privacy import NOISE_STREAM, Privacy, full_items, protected
from fedhf.trainer.config.combinations import check_setting_combinations
from fedhf.trainer.config.privacy_settings import count_std, privacy_card_rows
from fedhf.trainer.hooks.round_features import round_hooks
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


def _first_noise(args, n=1000):
    sums = RoundSums()
    sums.add("dx.a", torch.zeros(n))
    sums.add("w", 1.0)
    sums.add("n", 1.0)
    hook = Privacy(types.SimpleNamespace(args=args))
    hook.after_sums(None, None, sums)
    return hook, sums.get("dx.a")


def test_the_noise_follows_a_secret_drawn_per_run_not_the_seed_the_card_prints(tmp_path, monkeypatch):
    args = config(tmp_path, dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0)
    from_seed = torch.randn(1000, generator=torch.Generator().manual_seed(stream_seed(args.seed, NOISE_STREAM)),
                            dtype=torch.float64)
    (first, noise), (second, again) = _first_noise(args), _first_noise(args)
    assert not torch.equal(noise, again) and first.secret != second.secret  # a fresh secret per run
    assert not torch.allclose(noise, from_seed) and not torch.allclose(again, from_seed)  # the seed rebuilds nothing
    # only for tests: the seed's noise, the same in every run, and the card says there is no guarantee
    reproducible = config(tmp_path, dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0,
                          dp_reproducible_noise=True)
    assert torch.equal(_first_noise(reproducible)[1], from_seed)
    history = [{"round": 1, "dp_epsilon": 1.0, "dp_noise_multiplier": 1.0, "dp_clip_norm": 1.0}]
    assert "| noise | simulation: noise and cohorts reproducible from the seed, no guarantee |" in \
        privacy_card_rows(reproducible, history)
    assert not any("reproducible" in row for row in privacy_card_rows(args, history))
    reproducible.push_to_hub = True  # (the offline suite refuses push_to_hub itself first, so checked here)
    with pytest.raises(ValueError, match="dp_reproducible_noise=True.*cannot be combined with push_to_hub"):
        check_setting_combinations(reproducible)
    # every process uses the main process's secret (broadcast), shares and secure aggregation's masks included
    monkeypatch.setattr(privacy_hook, "value_of_the_main_process", lambda value: 12345)
    secure = config(tmp_path, num_clients=4, clients_per_round=4, dp_mode="distributed", dp_clip_norm=1.0,
                    dp_noise_multiplier=1.0, secure_aggregation=True)
    hook = Privacy(types.SimpleNamespace(args=secure))
    assert hook.secret == 12345 and hook.codec.seed == 12345
    assert torch.equal(torch.randn(3, generator=hook.noise, dtype=torch.float64),
                       torch.randn(3, generator=torch.Generator().manual_seed(stream_seed(12345, NOISE_STREAM)),
                                   dtype=torch.float64))


def test_adaptive_clipping_bits_are_centred_so_the_accounted_z_is_the_mechanism(tmp_path):
    """Andrew et al., Theorem 1: the (sums, count) pair is a Gaussian mechanism of z only if one client moves the
    count by half of what it moves the sums by (in units of C), i.e. the bit is b_i - 1/2."""
    args = config(tmp_path, num_clients=300, clients_per_round=10, num_rounds=12, client_sampling="poisson",
                  dp_mode="central", dp_clip_norm=0.1, dp_noise_multiplier=0.9, dp_adaptive_clip_quantile=0.5)
    hook = Privacy(types.SimpleNamespace(args=args))
    hook.cohort = [0]
    bits = []
    for size in (0.01, 10.0):  # under C, over C
        own = Message().put("dx", {"p": torch.full((4,), size)}).put_scalar("w", 1.0).put_scalar("n", 1.0)
        sent = hook.on_client_message(None, types.SimpleNamespace(client_id=0, round=0), ClientMessages(own, {}))
        bits.append(float(sent.components["dp"].tensors["below"]))
    assert bits == [0.5, -0.5]
    sensitivity = max(abs(b) for b in bits)  # add/remove-one: one client adds or takes away its bit
    true_z = (hook.z_sums ** -2 + (count_std(args) / sensitivity) ** -2) ** -0.5
    assert true_z == pytest.approx(hook.z, rel=1e-12)  # the accounted z (the uncentred bit gave 0.486, not 0.9)


def test_an_empty_poisson_round_is_noised_and_the_server_update_runs(tmp_path, minilm, tweets, tokenizer):
    """McMahan et al. 2018, Algorithm 1: (0 + noise) / S on every key; before, the model stayed bit-identical."""
    assert round_clients(5, 0, 4, 1, "poisson") == []  # seed 5's first round has no client
    before = trainable_state(lora_minilm(minilm, dropout=False))
    trainer, after = _run(tmp_path, minilm, tweets, tokenizer, seed=5, num_rounds=1, clients_per_round=1,
                          client_sampling="poisson", dp_noise_multiplier=1.0, dp_reproducible_noise=True,
                          **DP)  # reproducible: the cohorts are the seed's (else the secret's)
    assert trainer.federated_history[0]["participants"] == 0
    change = torch.cat([(after[k] - before[k]).double().flatten() for k in before])
    assert bool((change != 0).all())  # every protected tensor was noised
    # FedAvg moves the model by the noisy mean, (0 + N(0, (zC)^2)) / S: std 0.05 here (tens of thousands of draws)
    assert change.std().item() == pytest.approx(1.0 * 0.05 / 1, rel=0.03)


def _client(client_id: int, store: ClientStateStore, round_index: int = 0):
    return types.SimpleNamespace(round=round_index, client_id=client_id, store=store)


def test_distributed_shares_sum_to_noise_of_std_sigma_c(tmp_path):
    args = config(tmp_path, num_clients=8, clients_per_round=8, dp_mode="distributed", dp_clip_norm=0.5,
                  dp_noise_multiplier=1.2, secure_aggregation=True)
    hook, store = Privacy(types.SimpleNamespace(args=args)), ClientStateStore()
    total = sum(hook._noise_share({"dx.a": torch.zeros(40_000)}, _client(c, store))["dx.a"]
                for c in range(8))
    assert total.std().item() == pytest.approx(1.2 * 0.5, rel=0.02)  # 5.7 stds of the sample std, as above


def test_distributed_dp_shares_carry_the_accounted_noise_or_the_round_is_withheld(tmp_path):
    """With dp_min_survivors=3 of 4, any 3 survivors' shares sum to z C; 2 survivors would carry less than the
    accountant's noise (before: z C sqrt(2/4), released as if z C), so the round's sum is not released."""
    args = config(tmp_path, num_clients=4, clients_per_round=4, dp_mode="distributed", dp_clip_norm=0.5,
                  dp_noise_multiplier=1.2, secure_aggregation=True, dp_min_survivors=3)
    hook, store = Privacy(types.SimpleNamespace(args=args)), ClientStateStore()
    total = sum(hook._noise_share({"dx.a": torch.zeros(40_000)}, _client(c, store))["dx.a"]
                for c in range(3))
    assert total.std().item() == pytest.approx(1.2 * 0.5, rel=0.02)
    sums = RoundSums()
    sums.add("dx.a", total)
    sums.add("w", 2.0)
    sums.add("n", 2.0)
    hook.after_sums(None, None, sums)
    assert sums.scalar("w") == 0.0 and not bool(sums.get("dx.a").any())  # the trainer then keeps the model


def test_distributed_dp_reports_the_epsilon_against_the_server(tmp_path):
    """The server of a secure aggregation knows who took part: no amplification by sampling. A client's round is the
    plain Gaussian under replace-one (sigma / 2), composed over the rounds it took part in."""
    args = config(tmp_path, num_clients=300, clients_per_round=10, num_rounds=12, dp_mode="distributed",
                  secure_aggregation=True, dp_clip_norm=0.1, dp_noise_multiplier=1.313)  # epsilon 3.0 at 12 rounds
    hook = Privacy(types.SimpleNamespace(args=args))
    hook.accountant.rounds = 11
    entry = {"round": 12}
    hook.after_aggregate(None, None, None, entry)

    def direct(rounds):
        accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        accountant.compose(dp_accounting.GaussianDpEvent(hook.z / 2), rounds)
        return accountant.get_epsilon(args.dp_delta or 1 / 300 ** 1.1)

    assert entry["dp_epsilon"] == pytest.approx(3.0, abs=0.01)  # the amplified one, against third parties
    assert entry["dp_epsilon_vs_server_one_round"] == direct(1) and round(direct(1), 1) == 5.7
    assert entry["dp_epsilon_vs_server_every_round"] == direct(12) and round(direct(12), 0) == 31
    row = [r for r in privacy_card_rows(args, [entry]) if r.startswith("| epsilon against the server")]
    assert row and f"{direct(1):.4g} per round a client takes part" in row[0]


def test_dp_fedavg_without_noise_or_clipping_is_fedavg_exactly(tmp_path, minilm, tweets, tokenizer):
    _, plain = _run(tmp_path, minilm, tweets, tokenizer, name="plain")
    trainer, private = _run(tmp_path, minilm, tweets, tokenizer, name="dp", dp_mode="central", dp_clip_norm=1e9,
                            dp_noise_multiplier=0.0, dp_reproducible_noise=True)  # the seed's cohorts, as plain's
    assert all(torch.equal(plain[k], private[k]) for k in plain)
    assert [h["dp_epsilon"] for h in trainer.federated_history] == [math.inf, math.inf]


def test_history_epsilon_is_dp_accounting_the_run_stops_at_budget_and_the_card_says_so(tmp_path, minilm, tweets,
                                                                                       tokenizer):
    def direct(rounds):
        accountant = RdpAccountant()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(2.0)), rounds)
        return accountant.get_epsilon(1e-3)

    budget = (direct(2) + direct(3)) / 2  # between rounds 2 and 3
    settings = dict(num_clients=8, clients_per_round=4, num_rounds=5, client_sampling="poisson", save_every_rounds=1,
                    dp_noise_multiplier=2.0, dp_epsilon=budget, dp_delta=1e-3, dp_stop_at_budget=True, **DP)
    trainer, _ = _run(tmp_path, minilm, tweets, tokenizer, **settings)
    history = trainer.federated_history
    assert [h["round"] for h in history] == [1, 2]  # round 3 would have spent more than the budget
    assert [h["dp_epsilon"] for h in history] == [direct(1), direct(2)]
    # resumed from its last checkpoint, the run checks the budget before its first round: none is run (before: 3)
    resumed, _ = _run(tmp_path, minilm, tweets, tokenizer, resume=True, **settings)
    assert [h["round"] for h in resumed.federated_history] == [1, 2]
    assert not (tmp_path / "run" / "checkpoint-3").exists()
    trainer.save_model(str(tmp_path / "saved"))
    card = (tmp_path / "saved" / "README.md").read_text()
    assert f"({direct(2):.4g}, 0.001) after 2 rounds" in card and "dp-accounting RDP / Poisson, q = 4/8" in card


def _privacy_hook(trainer) -> Privacy:
    return next(h for h in trainer.hooks.hooks if isinstance(h, Privacy))


def test_a_resumed_dp_run_is_bit_identical_noise_and_adaptive_clip_included(tmp_path, minilm, tweets, tokenizer):
    """The noise follows a secret only the server's checkpoint holds: a run killed after round 1 and resumed from
    that checkpoint ends bit-identical to the uninterrupted run; the secret is nowhere else in what it wrote."""
    settings = dict(num_rounds=3, save_every_rounds=1, dp_noise_multiplier=0.5, dp_adaptive_clip_quantile=0.5,
                    dp_adaptive_clip_count_std=2.0, **DP)
    full, expected = _run(tmp_path, minilm, tweets, tokenizer, name="full", **settings)
    resumed, state = _run(tmp_path, minilm, tweets, tokenizer, name="resumed",
                          resume=str(tmp_path / "full" / "checkpoint-1"), **settings)
    assert all(torch.equal(expected[k], state[k]) for k in expected)
    secret = _privacy_hook(full).secret
    assert _privacy_hook(resumed).secret == secret != full.args.seed
    full.save_model(str(tmp_path / "full" / "saved"))
    text = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "full") for f in files
            if f.endswith((".json", ".md", ".txt"))]
    assert text and not any(str(secret) in open(path).read() for path in text)
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
                    secagg_bits=16, dp_reproducible_noise=True, **algorithm)  # the same rounding in both runs
    trainer_class = _DropsClientTwo if algorithm.get("algorithm") == "fedavg" else None
    if trainer_class is not None:  # the decoded mean is the plain mean up to one quantisation step per element
        _, clear = _run(tmp_path, minilm, tweets, tokenizer, name="clear", trainer_class=trainer_class,
                        **{**settings, "secure_aggregation": False, "dp_reproducible_noise": False})
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
    assert "dp_epsilon" in released and "uplink_MB" in released
    assert "compression_seconds" not in released  # wall-clock seconds follow the clients' row lengths: withheld
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
