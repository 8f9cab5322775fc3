"""Round hooks (fedhf/trainer/hooks/base.py): the message-level events really act on the round. A hook may replace a
client's messages before they enter the sums (the uplink counts what it returns) and change the summed messages
before the server update, which is where compression, local and central noise and secure aggregation plug in."""

from __future__ import annotations

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


class _Cohorts(RoundHook):
    def __init__(self) -> None:
        self.sizes = []

    def before_round(self, trainer, run) -> None:
        self.sizes.append(len(run.cohort))


def test_the_sample_size_is_each_hooks_answer_to_the_previous_and_the_loop_samples_it(digits, tmp_path):
    from fedhf.trainer.hooks.base import HookList

    assert HookList([_Double(), _Plus()]).sample_size(None, None, 3) == 7  # in list order: 2 x 3 + 1
    assert HookList([_Plus(), _Double()]).sample_size(None, None, 3) == 8
    assert HookList([RoundHook()]).sample_size(None, None, 3) == 3  # a hook that does not answer keeps it
    seen = _Cohorts()
    trainer = digit_trainer(tiny_resnet(), digits, config(tmp_path, num_clients=5, clients_per_round=2, num_rounds=2,
                                                          local_steps=1), evaluate=False, round_hooks=[_Plus(), seen])
    trainer.train()
    assert seen.sizes == [3, 3]  # clients_per_round 2, one more asked by the hook
