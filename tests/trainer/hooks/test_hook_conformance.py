"""The round-hook protocol (fedhf/trainer/hooks/base.py), checked on every hook a run builds and on the user-written one of
examples/round_hook_update_norms.py: each overridden event keeps the protocol's signature, ``select_clients``
answers distinct clients of the run (a subsequence of those it was given), ``on_client_message`` returns client messages, and a hook's
checkpoint state is JSON plus named tensor groups that ``restore_state`` reads back to the same state."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from fedhf import ClientMessages, RoundHook
from fedhf.core.message import Message
from fedhf.state.run import RunState

from tests.helpers import config, lora_minilm, tweet_trainer

EVENTS = [name for name, _ in inspect.getmembers(RoundHook, inspect.isfunction) if not name.startswith("_")]


@pytest.fixture(scope="module")
def trained(minilm, tweets, tokenizer, tmp_path_factory):
    """Two rounds of MiniLM-LoRA on tweets with the optional hooks switched on, plus the user's hook."""
    from round_hook_update_norms import UpdateNorms

    args = config(tmp_path_factory.mktemp("conformance"), num_clients=6, clients_per_round=3, num_rounds=2,
                  local_steps=1, save_every_rounds=1, eval_every_rounds=1, metric_for_best_model="eval_loss",
                  clock_profile="lognormal", round_policy="deadline", round_deadline_s=10.0,
                  client_sampling="poisson", uplink_compression="int8", dp_mode="central", dp_clip_norm=1.0,
                  dp_noise_multiplier=0.5, per_device_train_batch_size=8)
    tweets = {"train": tweets["train"].select(range(240)), "test": tweets["test"].select(range(32))}
    trainer = tweet_trainer(lora_minilm(minilm), tweets, tokenizer, args, round_hooks=[UpdateNorms(blocklist=[0])])
    trainer.train()
    return trainer


@pytest.fixture(scope="module", autouse=True)
def examples_on_path():
    import sys
    from pathlib import Path

    folder = str(Path(__file__).resolve().parents[3] / "examples")
    sys.path.insert(0, folder)
    yield
    sys.path.remove(folder)


def _hooks(trainer):
    return [pytest.param(hook, id=type(hook).__name__) for hook in trainer.hooks.hooks]


def test_every_hook_of_the_run_and_the_users_is_a_round_hook_keeping_the_signatures(trained):
    names = [type(h).__name__ for h in trained.hooks.hooks]
    assert "UpdateNorms" in names and "VirtualClock" in names and "Privacy" in names
    for hook in trained.hooks.hooks:
        assert isinstance(hook, RoundHook)
        for event in EVENTS:
            mine = getattr(type(hook), event)
            if mine is not getattr(RoundHook, event):
                assert list(inspect.signature(mine).parameters) == list(
                    inspect.signature(getattr(RoundHook, event)).parameters), (type(hook).__name__, event)


def test_select_clients_answers_a_subsequence_and_messages_stay_client_messages(trained):
    state = RunState({}, {}, {}, {}, rounds_done=1)
    for hook in trained.hooks.hooks:
        given = [5, 2, 0, 4]
        kept = hook.select_clients(trained, state, given)
        assert len(set(kept)) == len(kept) and all(0 <= c < trained.args.num_clients for c in kept)
        assert kept == [c for c in given if c in kept], type(hook).__name__
    sent = ClientMessages(Message({"dx.w": torch.ones(3)}), {})
    assert isinstance(trained.hooks.hooks[-1].on_client_message(trained, None, sent), ClientMessages)


def test_checkpoint_state_is_json_and_named_tensors_and_restores_to_the_same_state(trained):
    run = RunState({}, {}, {}, {}, rounds_done=2)
    seen_groups = set()
    for hook in trained.hooks.hooks:
        meta, groups = hook.checkpoint_state(trained, run)
        restored_meta = json.loads(json.dumps(meta))
        assert not seen_groups & set(groups), type(hook).__name__  # group names unique across hooks
        seen_groups |= set(groups)
        assert all(isinstance(t, torch.Tensor) for g in groups.values() for t in g.values())
        hook.restore_state(trained, run, restored_meta, {g: {k: t.clone() for k, t in v.items()}
                                                         for g, v in groups.items()})
        again_meta, again_groups = hook.checkpoint_state(trained, run)
        assert again_meta == meta, type(hook).__name__
        assert again_groups.keys() == groups.keys()
        assert all(torch.equal(again_groups[g][k], groups[g][k]) for g in groups for k in groups[g])


def test_the_users_hook_wrote_its_metrics_and_blocked_its_client(trained):
    history = trained.federated_history
    assert all("update_norm_median" in h and h["update_norm_max"] >= h["update_norm_median"] > 0 for h in history)
    assert "sim_time_s" in history[-1] and "dp_epsilon" in history[-1]


def test_check_round_hook_passes_every_hook_of_the_run_and_names_a_broken_one(trained):
    """fedhf.testing.check_round_hook: the same checks for a user's hook, without this file."""
    from fedhf.testing import check_round_hook

    for hook in trained.hooks.hooks:
        check_round_hook(hook, trained)

    class Repeats(RoundHook):
        def select_clients(self, trainer, run, clients):
            return clients + clients[:1]

    class Renamed(RoundHook):
        def after_aggregate(self, trainer, run, sums, log):
            log["x"] = 1.0

    with pytest.raises(AssertionError, match="Repeats.select_clients answered"):
        check_round_hook(Repeats(), trained)
    with pytest.raises(AssertionError, match=r"Renamed.after_aggregate takes .*'log'\]; the protocol's"):
        check_round_hook(Renamed(), trained)
