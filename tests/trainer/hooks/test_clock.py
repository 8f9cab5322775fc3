"""The simulated clock (fedhf/trainer/hooks/clock.py) in real runs: today's round bit for bit when every client waits at
the same speed, hand-computed round times, the deadline policy's choice, the budget, and an exact resume."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

from fedhf import FederatedConfig, FederatedTrainer, RoundHook
from fedhf.core.schedule import round_clients
from fedhf.simulation import client_seconds, deadline_round, lognormal_profiles
from fedhf.simulation.profile import MBPS

from tests.helpers import config, digit_trainer, tiny_resnet, trainable_state, without_timings


class _Cohorts(RoundHook):
    def __init__(self) -> None:
        self.cohorts = []

    def before_round(self, trainer, run) -> None:
        self.cohorts.append(list(run.cohort))


class _StopAfter(TrainerCallback):
    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.rounds


def _run(digits, tmp_path, name, hooks=(), callbacks=(), resume=None, **overrides):
    model = tiny_resnet()
    args = config(tmp_path / name, **{"num_clients": 6, "clients_per_round": 3, "num_rounds": 2, "local_steps": 2,
                                      **overrides})
    trainer = digit_trainer(model, digits, args, evaluate=False, round_hooks=list(hooks), callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, trainable_state(model)


def test_waiting_for_all_at_one_speed_is_todays_run_bit_for_bit_with_hand_computed_times(digits, tmp_path):
    plain, plain_model = _run(digits, tmp_path, "plain")
    timed, timed_model = _run(digits, tmp_path, "timed", clock_profile="uniform")
    assert all(torch.equal(plain_model[n], timed_model[n]) for n in plain_model)
    for a, b in zip(without_timings(plain.federated_history), without_timings(timed.federated_history)):
        assert {k: v for k, v in b.items() if not k.startswith("sim_")} == a
    dense = sum(p.numel() * 4 for p in tiny_resnet().parameters())
    rows = 2 * 16  # K x B rows of 8x8 images: one "token" each
    expected = dense / (20 * MBPS) + rows / 2000.0 + dense / (5 * MBPS)  # round 1: the dense model both ways
    history = timed.federated_history
    assert history[0]["sim_round_s"] == pytest.approx(expected, rel=1e-12)
    per_client_up = history[0]["uplink_MB"] * 2**20 / history[0]["participants"]  # round 2: round 1's sizes
    assert per_client_up != dense  # the buffers travel too: round 2 is timed with what round 1 measured
    per_client_down = history[0]["downlink_MB"] * 2**20 / history[0]["participants"]
    assert history[1]["sim_round_s"] == pytest.approx(
        per_client_down / (20 * MBPS) + rows / 2000.0 + per_client_up / (5 * MBPS), rel=1e-9)
    assert history[-1]["sim_time_s"] == pytest.approx(sum(h["sim_round_s"] for h in history), rel=1e-12)
    assert all(h["sim_dropped"] == 0 and h["sim_offline"] == 0 for h in history)


def test_the_deadline_over_selects_and_keeps_the_first_reports(digits, tmp_path):
    seen = _Cohorts()
    trainer, _ = _run(digits, tmp_path, "deadline", hooks=[seen], clock_profile="lognormal", clock_spread=1.5,
                      round_policy="deadline", round_deadline_s=5.0, over_selection=1.0, clock_tokens_per_s=20.0)
    profiles = lognormal_profiles(6, 0, 20.0, 5.0, 20.0, 1.5)
    up = down = float(sum(p.numel() * 4 for p in tiny_resnet().parameters()))
    for r, entry in enumerate(trainer.federated_history):
        sampled = round_clients(0, r, 6, 6, "fixed")  # ceil(2 x 3) of 6
        finish = {c: client_seconds(profiles[c], 32, up, down) for c in sampled}
        expected = deadline_round(finish, 5.0, 3)
        assert seen.cohorts[r] == expected.kept and entry["participants"] == len(expected.kept)
        assert entry["sim_round_s"] == pytest.approx(expected.seconds, rel=1e-12)
        assert entry["sim_dropped"] == 6 - len(expected.kept)
        before = trainer.federated_history[r - 1] if r else {"uplink_MB": 0.0, "downlink_MB": 0.0}
        up = (entry["uplink_MB"] - before["uplink_MB"]) * 2**20 / entry["participants"]  # the next round's sizes
        down = (entry["downlink_MB"] - before["downlink_MB"]) * 2**20 / entry["participants"]
    assert any(e["sim_dropped"] > 0 for e in trainer.federated_history)


def test_a_resumed_run_continues_the_same_clock_and_the_budget_stops_it(digits, tmp_path):
    settings = dict(clock_profile="lognormal", clock_availability=0.7, round_policy="deadline", round_deadline_s=3.0,
                    over_selection=0.5, client_sampling="poisson", save_every_rounds=1, num_rounds=4)
    whole, whole_model = _run(digits, tmp_path, "whole", **settings)
    _run(digits, tmp_path, "cut", callbacks=[_StopAfter(2)], **settings)
    resumed, resumed_model = _run(digits, tmp_path, "cut", resume=True, **settings)
    assert [h["round"] for h in resumed.federated_history] == [1, 2, 3, 4]
    assert without_timings(resumed.federated_history) == without_timings(whole.federated_history)  # simulated seconds included
    assert all(torch.equal(whole_model[n], resumed_model[n]) for n in whole_model)
    budget = whole.federated_history[1]["sim_time_s"]
    stopped, _ = _run(digits, tmp_path, "budget", **{**settings, "clock_budget_s": budget})
    assert [h["round"] for h in stopped.federated_history] == [1, 2]


@pytest.mark.parametrize("settings, message", [
    (dict(round_policy="deadline"), "clock_profile"),
    (dict(clock_profile="lognormal", round_policy="deadline"), "round_deadline_s"),
    (dict(clock_profile="lognormal", over_selection=0.3), "only applies to round_policy='deadline'"),
    (dict(clock_profile="nowhere.csv"), "one of .* or the path of a CSV trace"),
    (dict(clock_profile="uniform", async_concurrency=4), "applies to round_policy='fedbuff'"),
    (dict(clock_profile="uniform", round_policy="fedbuff", downlink_compression="int8"), "compressed downlink"),
])
def test_clock_settings_that_cannot_work_are_refused_with_the_fix(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        FederatedConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_clients=4, **settings)


class _Forced(RoundHook):
    """Takes the given clients in each round (a user's selection)."""

    def __init__(self, cohorts) -> None:
        self.cohorts = cohorts

    def select_clients(self, trainer, run, clients):
        return list(self.cohorts[run.rounds_done])


def test_fedbuff_with_one_speed_and_no_spare_clients_is_fedavg_over_its_dispatches(digits, tmp_path):
    seen = _Cohorts()
    buffered, buffered_model = _run(digits, tmp_path, "fedbuff", hooks=[seen], clock_profile="uniform",
                                    round_policy="fedbuff", async_concurrency=3)
    assert all(len(c) == 3 for c in seen.cohorts)  # every report arrives at once: all 3 slots refill
    assert all(h["staleness_max"] == 0 for h in buffered.federated_history)
    _, synchronous = _run(digits, tmp_path, "sync", hooks=[_Forced(seen.cohorts)])
    assert all(torch.allclose(buffered_model[n], synchronous[n], rtol=0, atol=1e-6) for n in synchronous)


def test_fedbuff_sums_stale_changes_weighted_and_state_changes_once(tmp_path):
    from types import SimpleNamespace

    from fedhf.core.sums import RoundSums
    from fedhf.runtime.sharded import NotSharded
    from fedhf.simulation import InFlight
    from fedhf.trainer.hooks.clock import VirtualClock
    from fedhf.state.run import RunState

    args = FederatedConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_clients=4,
                           clients_per_round=2, clock_profile="uniform", round_policy="fedbuff")
    trainer = SimpleNamespace(args=args, train_dataset=None, client_partitions=[[0]] * 4,
                              plan=SimpleNamespace(params={"w": torch.zeros(2)}), model_device=torch.device("cpu"),
                              shards=NotSharded())
    clock = VirtualClock(trainer)
    clock.in_flight = [InFlight(0, 0, 4.0), InFlight(1, 2, 3.0), InFlight(2, 3, 9.0)]
    clock.reports = {c: ({"dx.w": torch.tensor([1.0, 2.0]) * (c + 1), "w": torch.tensor(1.0),
                          "correction.dc.w": torch.tensor([1.0, 1.0])}, 100) for c in (0, 1, 2)}
    sums = RoundSums()
    sums.add("excluded", 1.0)
    sums.add("downlink_bytes", 64.0)
    clock.after_sums(trainer, RunState({}, {}, {}, {}, rounds_done=3), sums)
    # clients 1 (version 2: staleness 1) and 0 (version 0: staleness 3) report first
    expected = torch.tensor([1.0, 2.0]) * 2 / 2 ** 0.5 + torch.tensor([1.0, 2.0]) * 1 / 2.0
    assert torch.allclose(sums.get("dx.w"), expected.double())
    assert sums.scalar("w") == 2.0 and torch.equal(sums.get("correction.dc.w"), torch.tensor([2.0, 2.0]).double())
    assert sums.scalar("uplink_bytes") == 200 and sums.scalar("excluded") == 1.0 and sums.scalar("downlink_bytes") == 64
    assert [f.client for f in clock.in_flight] == [2] and list(clock.reports) == [2]
    assert clock.timing.seconds == 4.0 and clock.staleness == [1, 3]


def test_a_resumed_fedbuff_run_keeps_its_clients_in_flight(digits, tmp_path):
    settings = dict(clock_profile="lognormal", clock_spread=1.0, round_policy="fedbuff", async_concurrency=5,
                    save_every_rounds=1, num_rounds=4)
    whole, whole_model = _run(digits, tmp_path, "whole", **settings)
    assert max(h["staleness_max"] for h in whole.federated_history) > 0
    _run(digits, tmp_path, "cut", callbacks=[_StopAfter(2)], **settings)
    resumed, resumed_model = _run(digits, tmp_path, "cut", resume=True, **settings)
    assert without_timings(resumed.federated_history) == without_timings(whole.federated_history)
    assert all(torch.equal(whole_model[n], resumed_model[n]) for n in whole_model)


def test_fedbuff_times_a_refill_with_one_clients_download_not_the_dispatch_over_the_reports(tmp_path):
    """One device, one row length: every client's round lasts T. 6 clients are dispatched at t=0, the first 2 report
    at T; the 2 dispatched then report at 2T (the download is the dense model per client, however many reported)."""
    from datasets import Dataset
    from transformers import default_data_collator

    from fedhf.data.demo import tiny_llama

    ids = torch.randint(1, 64, (64, 16), generator=torch.Generator().manual_seed(0)).tolist()
    data = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 16] * 64, "labels": ids})
    model = tiny_llama(64, hidden_size=32, num_layers=1)
    args = config(tmp_path, num_clients=8, clients_per_round=2, num_rounds=4, local_steps=1,
                  per_device_train_batch_size=4, learning_rate=0.05, partition="iid", clock_profile="uniform",
                  clock_downlink_mbps=1.0, clock_uplink_mbps=100.0, round_policy="fedbuff", async_concurrency=6)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    trainer.train()
    dense = sum(p.numel() * p.element_size() for p in model.parameters())
    one_round = dense / (1.0 * MBPS) + 4 * 16 / 2000.0 + dense / (100.0 * MBPS)
    times = [h["sim_time_s"] for h in trainer.federated_history]
    staleness = [h["staleness_max"] for h in trainer.federated_history]
    assert times[:3] == pytest.approx([one_round] * 3, rel=1e-12)  # the 6 first dispatches, 2 per update
    assert staleness[:3] == [0, 1, 2]
    assert times[3] == pytest.approx(2 * one_round, rel=1e-9) and staleness[3] == 2  # dispatched at update 1


def test_a_run_the_budget_stops_evaluates_its_last_round_and_its_card_says_the_rounds_run(digits, tmp_path):
    dense = sum(p.numel() * 4 for p in tiny_resnet().parameters())
    first_round = dense / (20 * MBPS) + 2 * 16 / 2000.0 + dense / (5 * MBPS)  # as the first test computes it
    model = tiny_resnet()
    args = config(tmp_path / "budget", num_clients=6, clients_per_round=3, num_rounds=4, local_steps=2,
                  clock_profile="uniform", clock_budget_s=1.5 * first_round, eval_every_rounds=0)
    trainer = digit_trainer(model, digits, args)
    trainer.train()
    history = trainer.federated_history
    assert [h["round"] for h in history] == [1, 2]  # round 2 reaches 1.5 rounds' seconds
    assert "eval_loss" not in history[0] and "eval_accuracy" in history[1]  # evaluated as a last round is
    trainer.save_model(str(tmp_path / "final"))
    card = (tmp_path / "final" / "README.md").read_text()
    assert (f"| rounds (R) | 2 (of 4 planned; stopped by `clock_budget_s`={1.5 * first_round:g}, reached at "
            f"{history[1]['sim_time_s']:.6g} simulated seconds) |") in card
    assert f"final eval_accuracy (saved model, round 2) | {history[1]['eval_accuracy']:.4f}" in card


def test_a_run_dp_stop_at_budget_stops_evaluates_its_last_round_and_its_card_says_why(tmp_path):
    """dp_stop_at_budget ends the run as the clock's budget does: its last round evaluated, the card's reason."""
    from fedhf import FederatedTrainer
    from fedhf.data.sft import SFTCollator
    from tests.helpers import IdsOnly, answer_rows, tiny_llama_lora

    dp = dict(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=2.0, dp_delta=1e-3, num_clients=6,
              clients_per_round=3, num_rounds=4, local_steps=1, per_device_train_batch_size=4, partition="iid",
              eval_every_rounds=0, dp_reproducible_noise=True)

    def run(name, **settings):
        trainer = FederatedTrainer(model=tiny_llama_lora(100), args=config(tmp_path / name, **{**dp, **settings}),
                                   train_dataset=answer_rows(36), eval_dataset=answer_rows(8, seed=1),
                                   data_collator=SFTCollator(IdsOnly()))
        trainer.train()
        return trainer

    spent = [h["dp_epsilon"] for h in run("probe", num_rounds=3).federated_history]
    budget = (spent[1] + spent[2]) / 2  # room for 2 rounds, not 3
    trainer = run("stop", dp_epsilon=budget, dp_stop_at_budget=True)
    history = trainer.federated_history
    assert [h["round"] for h in history] == [1, 2]
    assert "eval_loss" not in history[0] and "eval_loss" in history[1]  # evaluated as a last round is
    trainer.data_collator.tokenizer.save_pretrained = lambda directory: None  # a stand-in tokenizer
    trainer.save_model(str(tmp_path / "final"))
    card = (tmp_path / "final" / "README.md").read_text()
    assert (f"| rounds (R) | 2 (of 4 planned; stopped by `dp_stop_at_budget`: the next round would spend more than "
            f"`dp_epsilon`={budget:g}, {history[1]['dp_epsilon']:.4g} spent) |") in card
