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
from fedhf.trainer.hooks.user_hooks_under_dp import ReleasedOnly

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


def _with_users(trainer):
    """The run's hooks, and under DP each user hook inside its ReleasedOnly too."""
    return list(trainer.hooks.hooks) + [h.hook for h in trainer.hooks.hooks if isinstance(h, ReleasedOnly)]


def test_every_hook_of_the_run_and_the_users_is_a_round_hook_keeping_the_signatures(trained):
    names = [type(h).__name__ for h in _with_users(trained)]
    assert "UpdateNorms" in names and "ReleasedOnly" in names and "VirtualClock" in names and "Privacy" in names
    for hook in _with_users(trained):
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


def test_the_users_hook_wrote_only_what_it_declared_under_dp(trained):
    """The run is under DP: the example's update norms (read from unclipped messages) are withheld, its declared
    blocklist count is written (docs/privacy.md, "Your own round hooks under DP")."""
    history = trained.federated_history
    assert all(set(_declared()) <= set(h) for h in history)
    assert not [k for h in history for k in h if k.startswith("update_norm")]
    assert "sim_time_s" in history[-1] and "dp_epsilon" in history[-1]


class _ZeroUpdates(RoundHook):
    """Sends every client's model change as zeros (a stand-in for any transform of ``dx``)."""

    def on_client_message(self, trainer, ctx, sent):
        own = Message({k: (v * 0 if k.startswith("dx.") else v) for k, v in sent.own.tensors.items()},
                      sent.own.nbytes, dict(sent.own.dense))
        return ClientMessages(own, sent.components, sent.theta)


class _Unchanged(RoundHook):
    def on_client_message(self, trainer, ctx, sent):
        return ClientMessages(Message(dict(sent.own.tensors), sent.own.nbytes, dict(sent.own.dense)),
                              sent.components, sent.theta)


class _Reweighted(RoundHook):
    """Doubles a client's weight and its weighted change together: the same Delta_i, sent with another w_i."""

    def on_client_message(self, trainer, ctx, sent):
        tensors = {k: (v * 2 if k == "w" or k.startswith("dx.") else v) for k, v in sent.own.tensors.items()}
        return ClientMessages(Message(tensors, sent.own.nbytes, dict(sent.own.dense)), sent.components, sent.theta)


@pytest.mark.parametrize("rule", ["mean", "median", "trimmed_mean"])
def test_every_server_rule_aggregates_what_on_client_message_returned(digits, tmp_path, rule):
    from tests.helpers import digit_trainer, tiny_resnet, trainable_state

    def run(name, hooks):
        model = tiny_resnet()
        args = config(tmp_path / name, server_rule=rule, num_clients=4, clients_per_round=4, num_rounds=1,
                      local_steps=2, learning_rate=0.5, client_weighting="num_samples", partition="dirichlet",
                      dirichlet_alpha=0.5)
        digit_trainer(model, digits, args, evaluate=False, round_hooks=hooks).train()
        return trainable_state(model)

    untouched = trainable_state(tiny_resnet())
    zeroed = run("zeroed", [_ZeroUpdates()])
    assert all(torch.equal(zeroed[n], untouched[n]) for n in untouched)  # the hook's zeros reached the rule
    plain, passed_on = run("plain", []), run("passed_on", [_Unchanged()])
    assert any(not torch.equal(plain[n], untouched[n]) for n in untouched)
    assert all(torch.equal(plain[n], passed_on[n]) for n in plain)  # w_i Delta_i / w_i: Delta_i to the last bit
    reweighted = run("reweighted", [_Reweighted()])  # Delta_i over the w_i the hook sent, not the trainer's
    assert all(torch.allclose(plain[n], reweighted[n], atol=1e-6) for n in plain)


def _declared():
    from round_hook_update_norms import UpdateNorms

    return UpdateNorms.released_under_dp


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

    class HalfMore(RoundHook):
        def sample_size(self, trainer, run, default):
            return default * 1.5

    with pytest.raises(AssertionError, match="Repeats.select_clients answered"):
        check_round_hook(Repeats(), trained)
    with pytest.raises(AssertionError, match=r"Renamed.after_aggregate takes .*'log'\]; the protocol's"):
        check_round_hook(Renamed(), trained)
    with pytest.raises(AssertionError, match=r"HalfMore.sample_size answered 4.5: .* a whole number"):
        check_round_hook(HalfMore(), trained)
