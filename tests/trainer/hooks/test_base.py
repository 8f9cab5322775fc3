"""Round hooks (fedhf/trainer/hooks/base.py): the message-level events really act on the round. A hook may replace a
client's messages before they enter the sums (the uplink counts what it returns) and change the summed messages
before the server update, which is where compression, local and central noise and secure aggregation plug in."""

from __future__ import annotations

import logging

import torch

from fedhf.core.message import Message
from fedhf.trainer.hooks.base import ClientMessages, RoundHook

from tests.helpers import config, digit_trainer, tiny_resnet, trainable_state


class _NothingSent(RoundHook):
    """Every client's model change replaced by zeros, sent as 0 bytes."""

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        own = Message({k: v * 0 if k.startswith("dx.") else v for k, v in sent.own.tensors.items()}, nbytes=0)
        return ClientMessages(own, sent.components, sent.theta)


class _SumsSeen(RoundHook):
    def __init__(self) -> None:
        self.participants = []

    def after_sums(self, trainer, run, sums) -> None:
        self.participants.append(sums.scalar("n"))


def test_a_users_hook_replaces_a_clients_message_before_the_sums(digits, tmp_path):
    seen = _SumsSeen()
    model = tiny_resnet()
    before = trainable_state(model)
    trainer = digit_trainer(model, digits, config(tmp_path, num_clients=3, clients_per_round=3, num_rounds=2,
                                                  local_steps=1), evaluate=False, round_hooks=[_NothingSent(), seen])
    trainer.train()
    after = trainable_state(model)
    assert all(torch.equal(before[n], after[n]) for n in before)  # x + mean(0) = x: the zeros were summed
    assert [h["uplink_MB"] for h in trainer.federated_history] == [0.0, 0.0]  # fedavg sends nothing else
    assert [h["participants"] for h in trainer.federated_history] == [3, 3]
    assert seen.participants == [3.0, 3.0]  # after the all-reduce, before the server update, every round


class _Plus(RoundHook):
    def sample_size(self, trainer, run, default: int) -> int:
        return default + 1


class _Double(RoundHook):
    def sample_size(self, trainer, run, default: int) -> int:
        return 2 * default


class _Sizes(RoundHook):
    """Each round's count of the clients ``which(run)`` names (run.cohort, or run.started: those the loop sampled
    that began the round)."""

    def __init__(self, which) -> None:
        self.which, self.sizes = which, []

    def before_round(self, trainer, run) -> None:
        self.sizes.append(len(self.which(run)))


def test_the_sample_size_is_each_hooks_answer_to_the_previous_and_the_loop_samples_it(digits, tmp_path):
    from fedhf.trainer.hooks.base import HookList

    assert HookList([_Double(), _Plus()]).sample_size(None, None, 3) == 7  # in list order: 2 x 3 + 1
    assert HookList([_Plus(), _Double()]).sample_size(None, None, 3) == 8
    assert HookList([RoundHook()]).sample_size(None, None, 3) == 3  # a hook that does not answer keeps it
    seen = _Sizes(lambda run: run.cohort)
    trainer = digit_trainer(tiny_resnet(), digits, config(tmp_path, num_clients=5, clients_per_round=2, num_rounds=2,
                                                          local_steps=1), evaluate=False, round_hooks=[_Plus(), seen])
    trainer.train()
    assert seen.sizes == [3, 3]  # clients_per_round 2, one more asked by the hook


class _Two(RoundHook):
    def sample_size(self, trainer, run, default: int) -> int:
        return 2


def test_the_clock_over_selects_the_hooks_answer_and_under_dp_no_users_hook_is_asked(tmp_path, caplog):
    """The clock comes after the user's hooks: its policy samples for the target they answered (the deadline
    over-selects it), it does not replace it by clients_per_round. Under DP a user hook is not asked (ReleasedOnly):
    the loop samples the accountant's cohort, the config's."""
    from tests.tiny_bert import tiny_run

    sizes = {}
    for name, clock in {"off": {}, "wait_all": {"clock_profile": "uniform"},
                        "deadline": {"clock_profile": "uniform", "round_policy": "deadline", "round_deadline_s": 1e9,
                                     "over_selection": 0.5}}.items():
        seen = _Sizes(lambda run: run.started)  # every client is online here
        tiny_run(tmp_path, name, num_clients=8, clients_per_round=4, round_hooks=[_Two(), seen], **clock)
        sizes[name] = seen.sizes
    assert sizes == {"off": [2, 2], "wait_all": [2, 2], "deadline": [3, 3]}  # deadline: ceil(1.5 x 2)
    seen = _Sizes(lambda run: run.started)  # every client is online here
    with caplog.at_level(logging.WARNING, logger="fedhf"):
        tiny_run(tmp_path, "dp", num_clients=8, clients_per_round=4, round_hooks=[_Two(), seen], dp_mode="central",
                 dp_clip_norm=1.0, dp_noise_multiplier=1.0, clock_profile="uniform", round_policy="deadline",
                 round_deadline_s=1e9, over_selection=0.5)
    assert seen.sizes == [6, 6]  # the config's ceil(1.5 x 4), what the accountant counts
    assert "_Two.sample_size is not asked" in caplog.text  # not silently: the user learns their hook is ignored
