"""Checks for code users write against fedhf's protocols, for their own tests.

``check_round_hook(hook, trainer)`` runs the round-hook conformance checks (the ones
tests/trainer/hooks/test_hook_conformance.py runs on every built-in hook) on one hook: each overridden event keeps
the protocol's parameters; ``sample_size`` answers a whole number of clients, at least 0; ``select_clients``
answers distinct clients of the run, a subsequence of those it was given; ``on_client_message`` returns client messages; the checkpoint state is JSON plus named tensor groups that
``restore_state`` reads back to the same state. ``trainer`` is the FederatedTrainer the hook is for (built, trained
or not). It raises AssertionError naming the first problem.
"""

from __future__ import annotations

import inspect
import json

import torch

from .core.client_store import ClientStateStore
from .core.context import ClientContext
from .core.message import Message
from .core.params import snapshot, trainable_parameters
from .state.run import RunState
from .trainer.hooks.base import ClientMessages, RoundHook

EVENTS = [name for name, _ in inspect.getmembers(RoundHook, inspect.isfunction) if not name.startswith("_")]


def check_round_hook(hook, trainer) -> None:
    name = type(hook).__name__
    assert isinstance(hook, RoundHook), f"{name} is not a fedhf.RoundHook (subclass it)"
    for event in EVENTS:
        mine = getattr(type(hook), event)
        if mine is not getattr(RoundHook, event):
            expected = list(inspect.signature(getattr(RoundHook, event)).parameters)
            got = list(inspect.signature(mine).parameters)
            assert got == expected, f"{name}.{event} takes {got}; the protocol's parameters are {expected}"
    run = RunState({}, {}, {}, {}, rounds_done=1)
    size = hook.sample_size(trainer, run, trainer.args.clients_per_round)
    assert isinstance(size, int) and not isinstance(size, bool) and size >= 0, (
        f"{name}.sample_size answered {size!r}: it must return how many clients to sample, a whole number >= 0")
    given = [c for c in (5, 2, 0, 4) if c < trainer.args.num_clients] or [0]
    kept = list(hook.select_clients(trainer, run, list(given)))
    assert len(set(kept)) == len(kept) and kept == [c for c in given if c in kept], (
        f"{name}.select_clients answered {kept} for {given}: it must return distinct clients it was given, in order")
    if type(hook).on_client_message is not RoundHook.on_client_message:
        answer = hook.on_client_message(trainer, _client_context(trainer), _client_messages(trainer))
        assert isinstance(answer, ClientMessages), f"{name}.on_client_message returned {type(answer).__name__}"
    _check_checkpoint_state(hook, trainer, name)


def _client_context(trainer) -> ClientContext:
    """Client 0 in round 1, on the trainer's model, with a client store of its own (the trainer's is not touched)."""
    params = trainable_parameters(trainer.model)
    return ClientContext(client_id=0, round=1, round_lr=1.0, local_lr=1.0, local_steps=trainer.args.local_steps,
                         weight=1.0, params=params, global_params=snapshot(params), correction_state={},
                         store=ClientStateStore(device=trainer.model_device), num_clients=trainer.args.num_clients)


def _client_messages(trainer) -> ClientMessages:
    """The trainer's own message of a client that did not move (zero changes), as the round builds it."""
    zeros = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in trainable_parameters(trainer.model).items()}
    return ClientMessages(Message().put("dx", zeros).put_scalar("w", 1.0).put_scalar("n", 1.0), {})


def _check_checkpoint_state(hook, trainer, name: str) -> None:
    run = RunState({}, {}, {}, {}, rounds_done=2)
    meta, groups = hook.checkpoint_state(trainer, run)
    try:
        restored_meta = json.loads(json.dumps(meta))
    except TypeError as err:
        raise AssertionError(f"{name}.checkpoint_state's meta is not JSON: {err}") from None
    assert all(isinstance(t, torch.Tensor) for g in groups.values() for t in g.values()), (
        f"{name}.checkpoint_state's groups must map names to tensors")
    hook.restore_state(trainer, run, restored_meta, {g: {k: t.clone() for k, t in v.items()} for g, v in groups.items()})
    again_meta, again_groups = hook.checkpoint_state(trainer, run)
    assert again_meta == meta and again_groups.keys() == groups.keys() and all(
        torch.equal(again_groups[g][k], groups[g][k]) for g in groups for k in groups[g]), (
        f"{name}.restore_state does not read back what checkpoint_state wrote")
