"""The round hooks' state in a round checkpoint (fedhf/trainer/hooks/hook_state.py): each hook gets back its own
meta and groups, two instances of one hook class included; a checkpoint written before hooks had keys still
restores; processes whose hook state differs are named."""

from __future__ import annotations

import json

import torch

from fedhf import RoundHook
from fedhf.trainer.hooks.base import HookList
from fedhf.trainer.hooks.hook_state import PER_HOOK, differing_hooks, hook_keys


class _Counter(RoundHook):
    """Keeps a count (meta, under one fixed key) and a tensor (a group of one fixed name)."""

    def __init__(self, count: int = 0) -> None:
        self.count, self.seen = count, torch.full((2,), float(count))

    def checkpoint_state(self, trainer, run):
        return {"counter": {"count": self.count}}, {"counter_seen": {"seen": self.seen}}

    def restore_state(self, trainer, run, meta, groups):
        self.count = int(meta.get("counter", {}).get("count", -1))
        self.seen = groups["counter_seen"]["seen"]


class _Other(RoundHook):
    def checkpoint_state(self, trainer, run):
        return {"other": 1}, {}


def _round_trip(saved: HookList, fresh: HookList) -> None:
    meta, groups = saved.checkpoint_state(None, None)
    fresh.restore_state(None, None, json.loads(json.dumps(meta)), {g: dict(t) for g, t in groups.items()})


def test_two_instances_of_one_hook_class_each_get_their_own_state_back():
    saved = HookList([_Counter(3), _Other(), _Counter(7)])
    assert hook_keys(saved.hooks) == ["_Counter", "_Other", "_Counter#2"]
    fresh = HookList([_Counter(), _Other(), _Counter()])
    _round_trip(saved, fresh)
    assert [fresh.hooks[0].count, fresh.hooks[2].count] == [3, 7]
    assert torch.equal(fresh.hooks[0].seen, torch.full((2,), 3.0))
    assert torch.equal(fresh.hooks[2].seen, torch.full((2,), 7.0))


def test_a_checkpoint_written_before_hooks_had_keys_restores_as_then():
    fresh = HookList([_Counter(), _Other()])
    fresh.restore_state(None, None, {"counter": {"count": 5}, "other": 1}, {"counter_seen": {"seen": torch.ones(2)}})
    assert fresh.hooks[0].count == 5 and torch.equal(fresh.hooks[0].seen, torch.ones(2))


def test_processes_whose_hook_state_differs_are_named():
    same = {PER_HOOK: {"_Counter": {"counter": {"count": 3}}, "_Other": {"other": 1}}}
    other = {PER_HOOK: {"_Counter": {"counter": {"count": 4}}, "_Other": {"other": 1}}}
    assert differing_hooks([same, json.loads(json.dumps(same))]) == []
    assert differing_hooks([same, other]) == ["_Counter"]
    assert differing_hooks([same, {PER_HOOK: {"_Other": {"other": 1}}}]) == ["_Counter"]
