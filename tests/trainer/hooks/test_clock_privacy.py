"""DP and secure aggregation under the simulated clock (docs/privacy.md, "Dropped clients"), in real runs whose
drops the clock causes: a CSV trace makes clients 3 and 4 miss the deadline every round, so 3 of the 4 clients a
round aims for report. Central DP adds noise of std sigma C to the survivors' clipped sum and divides by the fixed
S; distributed DP's survivors carry sigma C sqrt(survivors / S_min), or the round is withheld; secure aggregation's
masks are agreed with every client that began the round and the late clients' masks are removed by its recovery,
so the decoded sum is the survivors' plain sum to one quantisation step each. Over-selection is accounted at the
over-selected cohort; FedBuff is refused with DP and with secure aggregation, each with its reason."""

from __future__ import annotations

import math
import types

import pytest
import torch
from datasets import Dataset

from fedhf import FederatedConfig, RoundHook
from fedhf.privacy import PrivacyAccountant, calibrate_noise, clip_jointly
from fedhf.runtime.sharded import NotSharded
from fedhf.simulation import available_clients
from fedhf.trainer.hooks.clock import VirtualClock
from fedhf.trainer.hooks.privacy import Privacy, full_items, protected
from fedhf.trainer.config.privacy_settings import dp_delta, privacy_card_rows
from tests.helpers import config, lora_minilm, trainable_state, tweet_trainer

FAST, SLOW = (0, 1, 2), (3, 4)


def _trace(tmp_path) -> str:
    """Clients 0-2 finish a round in milliseconds, clients 3-4 in minutes: a 1 s deadline drops 3 and 4."""
    path = tmp_path / "devices.csv"
    rows = [f"{c},{1e6 if c in FAST else 1.0},1000,1000" for c in range(5)]
    path.write_text("client_id,tokens_per_s,uplink_mbps,downlink_mbps\n" + "\n".join(rows) + "\n")
    return str(path)


# every client of 5 is sampled (ceil(1.25 x 4) = 5); 4 are wanted, 3 report in time
CLOCK = dict(num_clients=5, clients_per_round=4, round_policy="deadline", round_deadline_s=1.0, over_selection=0.25)


class _Recorder(RoundHook):
    """A user hook (it runs before the privacy hook): each client's protected tensors as it sends them, and the
    round's sums as the server update reads them (after the noise and the decoding)."""

    def __init__(self) -> None:
        self.sent, self.released = {}, {}

    def on_client_message(self, trainer, ctx, sent):
        self.sent[ctx.client_id] = {k: v.detach().double().clone() for k, v in full_items(sent).items()
                                    if protected(k, v)}
        return sent

    def after_aggregate(self, trainer, run, sums, entry):
        self.released = {k: v.clone() for k, v in sums.items()}


def _run(tmp_path, minilm, tweets, tokenizer, name, **settings):
    args = config(tmp_path, output_dir=str(tmp_path / name), num_rounds=1, local_steps=1,
                  per_device_train_batch_size=8, partition_report=False, clock_profile=_trace(tmp_path),
                  **{**CLOCK, **settings})
    recorder, model = _Recorder(), lora_minilm(minilm, dropout=False)
    trainer = tweet_trainer(model, tweets, tokenizer, args, evaluate=False, round_hooks=[recorder])
    trainer.train()
    privacy = next(h for h in trainer.hooks.hooks if isinstance(h, Privacy))
    return trainer, recorder, privacy, trainable_state(model)


def _noise(recorder, clip_norm=None) -> torch.Tensor:
    """The released dx sum minus the survivors' (clipped) plain sum, every element."""
    plain = {}
    for items in recorder.sent.values():
        items = clip_jointly(items, clip_norm)[0] if clip_norm is not None else items
        for k, v in items.items():
            plain[k] = plain.get(k, 0) + v
    return torch.cat([(recorder.released[k].double().cpu() - plain[k]).flatten() for k in plain if k.startswith("dx.")])


def test_over_selection_is_accounted_at_the_over_selected_cohort(tmp_path):
    """Any of the ceil(1.3 x 10) = 13 sampled clients may be among the reports kept, so the event's cohort is 13:
    the noise is calibrated for q = 13/100 (before, over-selection was refused under DP)."""
    args = config(tmp_path, num_clients=100, clients_per_round=10, num_rounds=5, client_sampling="poisson",
                  dp_mode="central", dp_clip_norm=1.0, dp_epsilon=4.0, clock_profile="lognormal",
                  round_policy="deadline", round_deadline_s=10.0, over_selection=0.3)
    hook = Privacy(types.SimpleNamespace(args=args))
    assert hook.accountant.cohort == 13
    assert hook.z == calibrate_noise(4.0, dp_delta(args), 5, "poisson", 100, 13)
    at_target = PrivacyAccountant(hook.z, dp_delta(args), "poisson", 100, 10).epsilon(5)
    assert hook.accountant.epsilon(5) <= 4.0 and at_target < 3.9  # q = 10/100 would under-count the spend
    history = [{"round": 5, "dp_epsilon": 4.0, "dp_noise_multiplier": hook.z, "dp_clip_norm": 1.0}]
    assert any("Poisson, q = 13/100" in row for row in privacy_card_rows(args, history))


def test_central_dp_noises_the_survivors_sum_with_sigma_c_over_the_fixed_cohort(tmp_path, minilm, tweets, tokenizer):
    """Fixed-size sampling with clock drops (refused before): the deadline keeps 3 of the 5 sampled; the noise on
    their clipped sum has std z C whatever the cohort that survived (the sum's sensitivity is 2C under replace-one
    either way), the mean divides by the fixed S = 4, and the accountant's cohort is the 5 sampled."""
    z, clip = 1.3, 0.05
    trainer, recorder, privacy, _ = _run(tmp_path, minilm, tweets, tokenizer, "central", dp_mode="central",
                                         dp_clip_norm=clip, dp_noise_multiplier=z)
    entry = trainer.federated_history[0]
    assert sorted(recorder.sent) == list(FAST) and entry["participants"] == 3 and entry["sim_dropped"] == 2
    noise = _noise(recorder, clip)  # ~150,000 elements: the sample std within 0.2 %; 2 % is 10 of those
    assert noise.std().item() == pytest.approx(z * clip, rel=0.02)
    assert recorder.released["w"].item() == 4.0  # DP-FedAvg's fixed denominator, not the 3 survivors
    assert privacy.accountant.cohort == 5
    assert entry["dp_epsilon"] == PrivacyAccountant(z, dp_delta(trainer.args), "fixed", 5, 5).epsilon(1)


def test_distributed_dp_survivors_carry_their_shares_or_the_round_is_withheld(tmp_path, minilm, tweets, tokenizer):
    """Shares sized for S_min = 2: the 3 survivors' shares sum to std z C sqrt(3/2) (>= z C), through secure
    aggregation whose masks the 2 late clients agreed and never cancelled. With the default S_min = S = 4 the 3
    survivors' shares would carry less than z C: the round is withheld and the model stays."""
    z, clip = 1.0, 0.05
    trainer, recorder, privacy, _ = _run(tmp_path, minilm, tweets, tokenizer, "distributed", dp_mode="distributed",
                                         secure_aggregation=True, dp_clip_norm=clip, dp_noise_multiplier=z,
                                         dp_min_survivors=2)
    assert sorted(privacy.cohort) == [0, 1, 2, 3, 4] and trainer.federated_history[0]["participants"] == 3
    noise = _noise(recorder, clip)  # the rounding adds < 1e-6 of variance relative to the shares'
    assert noise.std().item() == pytest.approx(z * clip * math.sqrt(3 / 2), rel=0.02)
    before = trainable_state(lora_minilm(minilm, dropout=False))
    _, withheld, _, after = _run(tmp_path, minilm, tweets, tokenizer, "withheld", dp_mode="distributed",
                                 secure_aggregation=True, dp_clip_norm=clip, dp_noise_multiplier=z)
    assert len(withheld.sent) == 3 and all(torch.equal(before[k], after[k]) for k in before)


def test_secure_aggregation_removes_the_late_clients_masks(tmp_path, minilm, tweets, tokenizer):
    """Every client that began the round masked with every other; the 2 late ones never report, and the server
    removes their masks from the 3 survivors' sum (SecAgg's recovery): the decoded sum is the survivors' plain sum
    to one quantisation step per survivor, and the model moves by their plain mean (before, refused)."""
    bits, c = 24, 1.0
    trainer, recorder, privacy, after = _run(tmp_path, minilm, tweets, tokenizer, "secure", secure_aggregation=True,
                                             secagg_bits=bits, secagg_range=c)
    assert sorted(privacy.cohort) == [0, 1, 2, 3, 4] and sorted(recorder.sent) == list(FAST)
    step = 2 * c / (2 ** bits - 1)
    assert _noise(recorder).abs().max().item() <= 3 * step
    before = trainable_state(lora_minilm(minilm, dropout=False))
    mean = {k: sum(items[f"dx.{k}"] for items in recorder.sent.values()) / 3 for k in before}
    assert recorder.released["w"].item() == 3.0
    assert max((after[k].double() - before[k].double() - mean[k]).abs().max().item() for k in before) <= 2 * step
    assert any((after[k] != before[k]).any() for k in before)


def test_a_poisson_deadline_under_dp_keeps_every_report_in_time(tmp_path):
    """Under DP with Poisson sampling a deadline keeps every report within it: with the cap of clients_per_round
    one client's presence could push another's report out, a change of 2C under add-or-remove-one, twice what the
    accountant assumes. Fixed-size sampling (replace-one: 2C already) keeps the cap."""
    kept = {}
    for sampling in ("poisson", "fixed"):
        args = config(tmp_path, **{**CLOCK, "clients_per_round": 2, "over_selection": 0.0},
                      clock_profile=_trace(tmp_path), client_sampling=sampling, dp_mode="central", dp_clip_norm=1.0,
                      dp_noise_multiplier=1.0)
        trainer = types.SimpleNamespace(args=args, train_dataset=Dataset.from_dict({"label": list(range(5))}),
                                        client_partitions=[[c] for c in range(5)],
                                        plan=types.SimpleNamespace(params={"w": torch.zeros(10)}), shards=NotSharded())
        run = types.SimpleNamespace(rounds_done=0, started=[0, 1, 2, 3, 4])
        kept[sampling] = VirtualClock(trainer).select_clients(trainer, run, [0, 1, 2, 3, 4])
        assert run.started == [0, 1, 2, 3, 4]  # every client began; the late ones then dropped
    assert kept == {"poisson": [0, 1, 2], "fixed": [0, 1]}


def test_offline_clients_never_began_but_a_client_dropped_by_a_hook_did(tmp_path):
    """``run.started`` (the mask partners) loses the clients the clock finds offline, which never began the round;
    a client an earlier hook took out of the selection stays in it, and its masks are removed by the recovery."""
    args = config(tmp_path, num_clients=5, clients_per_round=5, clock_profile="uniform", clock_availability=0.5)
    trainer = types.SimpleNamespace(args=args, train_dataset=Dataset.from_dict({"label": list(range(5))}),
                                    client_partitions=[[c] for c in range(5)],
                                    plan=types.SimpleNamespace(params={"w": torch.zeros(10)}), shards=NotSharded())
    clock = VirtualClock(trainer)
    online = available_clients(args.seed, 0, [0, 1, 2, 3], clock.profiles)
    assert 0 < len(online) < 4  # seed 0's round 1 has clients offline
    run = types.SimpleNamespace(rounds_done=0, started=[0, 1, 2, 3, 4])  # a user hook dropped client 4
    assert clock.select_clients(trainer, run, [0, 1, 2, 3]) == online and run.started == online + [4]


@pytest.mark.parametrize("settings, message", [
    (dict(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0, client_sampling="poisson"),
     "has no sampled cohort"),
    (dict(secure_aggregation=True), "pairwise masks cannot be agreed"),
])
def test_fedbuff_is_refused_with_dp_and_with_secure_aggregation(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        FederatedConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_clients=4,
                        clock_profile="uniform", round_policy="fedbuff", **settings)


def test_under_dp_no_round_time_follows_from_the_printed_seed(tmp_path):
    """Under DP the devices and who is online follow the secret, not the printed seed: a card reader who knew each
    client's device could tell from sim_round_s (wait_all: the slowest sampled client's time) who was in the
    secret cohort. Every round's time must be one of the secret devices', none of the seed's."""
    from fedhf.simulation import client_seconds
    from fedhf.trainer.hooks.clock import VirtualClock, profiles_of
    from tests.tiny_bert import tiny_run

    trainer = tiny_run(tmp_path, num_clients=8, clients_per_round=2, num_rounds=4, dp_mode="central",
                       dp_clip_norm=0.05, dp_noise_multiplier=1.0, clock_profile="lognormal", round_policy="wait_all")
    clock = next(h for h in trainer.hooks.hooks if isinstance(h, VirtualClock))
    public = profiles_of(trainer.args)  # what the card's seed gives
    assert clock.seed == trainer.privacy.cohort_seed() != trainer.args.seed
    assert [p for p in clock.profiles] != [p for p in public]
    for r, entry in enumerate(trainer.federated_history):
        up, down = clock.uplink_bytes, clock.downlink_bytes
        if r == 0:  # the first round is timed with the dense model; later ones with the measured messages
            up = down = float(sum(t.numel() * t.element_size() for t in trainer.plan.params.values()))
        secret = [client_seconds(p, clock.tokens[c], up, down) for c, p in enumerate(clock.profiles)]
        seeds = [client_seconds(p, clock.tokens[c], up, down) for c, p in enumerate(public)]
        if r == 0:
            assert min(abs(t - entry["sim_round_s"]) for t in secret) < 1e-9
            assert min(abs(t - entry["sim_round_s"]) for t in seeds) > 1e-6
