"""Round hooks: what a run does around its rounds, beside the round itself.

The loop (:meth:`fedhf.trainer.FederatedTrainer.train` and ``_run_round``) is a fixed sequence of steps; every
optional round feature is a :class:`RoundHook` in the list ``round_hooks`` builds
(fedhf/trainer/hooks/round_features.py), and the loop calls each
event on every hook, in list order, with the trainer and the run's state (:class:`fedhf.state.run.RunState`)
passed in. Every method is a no-op here, so a hook overrides only the events it needs. Events, in the order a run
meets them:

* ``on_train_begin(trainer, run)``: once, after the global model (fresh or resumed) is in the resident model.
* ``sample_size(trainer, run, default) -> int``: how many clients the loop samples this round, given the previous
  hook's answer (``clients_per_round`` first); the clock's deadline policy over-selects here. The privacy
  accountant's cohort is the same number, computed from the config (fedhf/trainer/config/clock_policy.py).
* ``select_clients(trainer, run, clients) -> clients``: the round's sampled clients, before anything else of the
  round; a hook returns the clients that take part (the simulated clock drops offline and late clients here; under
  FedBuff it answers its own dispatch instead). Each
  hook gets the previous one's answer; ``run.cohort`` then holds the result for the rest of the round, and
  ``run.started`` the clients that began it (secure aggregation's mask partners: the sampled ones, less those a hook
  found offline before they started; a client in it but not in the cohort dropped after it began).
* ``before_round(trainer, run)``: before this process's clients train.
* ``broadcast_bytes(trainer, run, dense) -> bytes``: what the broadcast to one client costs, given its dense size
  (a compressed downlink returns its encoded size; fedhf/trainer/hooks/compression.py).
* ``on_client_message(trainer, ctx, sent) -> sent``: one client's messages (:class:`ClientMessages`) after its local
  steps and before they enter the round's sums; a hook may return other messages (compression, local noise) and
  the uplink counts what the last hook returns. Not called for an excluded client. It runs on the process that
  trained the client, under FSDP with this process's rows (fedhf/trainer/hooks/process_totals.py: what it sees,
  and the totals over shards and processes).
* ``after_sums(trainer, run, sums)``: the round's sums after the all-reduce, before the server update (central
  noise, the decoding of a secure aggregation); the hook may change them in place.
* ``after_aggregate(trainer, run, sums, entry)``: after the server update, with the new global model in the resident
  model; ``entry`` is the round's log, to which a hook may add metrics.
* ``after_evaluate(trainer, run, entry)``: after a round's global evaluation (``entry`` has its ``eval_*`` keys).
* ``after_round(trainer, run, entry) -> stop``: after the round's log, evaluation and callbacks (also for the round
  0 entry of ``eval_on_start``); True asks the run to stop.
* ``on_checkpoint(trainer, run, directory)``: a round checkpoint was written (on the main process).
* ``on_train_end(trainer, run)``: once, after the last round.

A hook that keeps state across rounds (the privacy accountant, its noise stream) hands it to the round checkpoint
with ``checkpoint_state(trainer, run) -> (meta, groups)`` (JSON values; safetensors groups, named uniquely) and gets
its own back, before ``on_train_begin``, with ``restore_state(trainer, run, meta, groups)``; each hook's state is kept
under its own key, and must be the same on every process (fedhf/trainer/hooks/hook_state.py).

A new round feature is a file with its hook plus its line in ``round_hooks`` (fedhf/trainer/hooks/round_features.py).
A user's own hooks are passed as ``FederatedTrainer(round_hooks=[...])`` (docs/round_hooks.md): they run after the
built-in diagnostics and before the message transforms (compression, privacy, the clock), so a clip bounds what a user hook
sends and the history records what a user hook adds to a round's log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from ...core.message import Message
from ...core.params import TensorDict
from . import hook_state


@dataclass
class ClientMessages:
    """What one client sends: the trainer's own message (``dx``, ``buf``, ``w``, ``n``, ``loss``; keys as they are),
    each component's message by namespace (``correction``, ``sync``, ``server``), and the client's shared Theta_i,
    which no message has to carry (the drift metric reads it here)."""

    own: Message
    components: Dict[str, Message]
    theta: TensorDict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return self.own.nbytes + sum(m.nbytes for m in self.components.values())


class RoundHook:
    """The protocol (see the module docstring); every event does nothing by default."""

    #: Under client-level DP, the keys of a round's log this hook may write (values computed from public data or
    #: the released model alone); every other key a user hook writes is withheld then
    #: (fedhf/trainer/hooks/user_hooks_under_dp.py).
    released_under_dp: Tuple[str, ...] = ()
    #: True for a hook whose ``sample_size`` and ``select_clients`` stay within what the round policy declares (the
    #: clock asks the policy): the memory plan then bounds the clients a run trains
    #: (fedhf/trainer/runners/memory_plan.py). Any other hook that overrides ``sample_size`` may sample any number,
    #: and one that overrides ``select_clients`` may add clients the loop did not sample.
    sample_within_policy: bool = False

    def on_train_begin(self, trainer, run) -> None:
        pass

    def sample_size(self, trainer, run, default: int) -> int:
        return default

    def select_clients(self, trainer, run, clients: Sequence[int]) -> List[int]:
        return list(clients)

    def before_round(self, trainer, run) -> None:
        pass

    def broadcast_bytes(self, trainer, run, dense: int) -> int:
        return dense

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        return sent

    def after_sums(self, trainer, run, sums) -> None:
        pass

    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        pass

    def after_evaluate(self, trainer, run, entry: dict) -> None:
        pass

    def after_round(self, trainer, run, entry: dict) -> bool:
        return False

    def on_checkpoint(self, trainer, run, directory: str) -> None:
        pass

    def on_train_end(self, trainer, run) -> None:
        pass

    def checkpoint_state(self, trainer, run) -> Tuple[dict, Dict[str, TensorDict]]:
        return {}, {}

    def restore_state(self, trainer, run, meta: dict, groups: Dict[str, TensorDict]) -> None:
        pass

    @property
    def state_name(self) -> str:
        """The name its state is kept under in a round checkpoint and named by in errors: the hook's class."""
        return type(self).__name__


def overrides(hook: RoundHook, event: str) -> bool:
    """Whether ``hook``'s class answers ``event`` itself (not RoundHook's default)."""
    return getattr(type(hook), event) is not getattr(RoundHook, event)


class HookList(RoundHook):
    """The hooks as one: each event calls every hook in order (``on_client_message`` passes each hook's result
    to the next; ``after_round`` stops when any hook asks to, after every hook has run)."""

    def __init__(self, hooks: Sequence[RoundHook]) -> None:
        self.hooks: List[RoundHook] = list(hooks)

    @property
    def resizes_sample(self) -> bool:
        """Whether a hook may sample more clients a round than the round policy declares."""
        return any(overrides(h, "sample_size") and not h.sample_within_policy for h in self.hooks)

    @property
    def may_add_clients(self) -> bool:
        """Whether a hook's ``select_clients`` may add clients to the round's sample (refused at run time under
        secure aggregation only)."""
        return any(overrides(h, "select_clients") and not h.sample_within_policy for h in self.hooks)

    def on_train_begin(self, trainer, run) -> None:
        for hook in self.hooks:
            hook.on_train_begin(trainer, run)

    def sample_size(self, trainer, run, default: int) -> int:
        for hook in self.hooks:
            default = hook.sample_size(trainer, run, default)
        return default

    def select_clients(self, trainer, run, clients: Sequence[int]) -> List[int]:
        for hook in self.hooks:
            clients = hook.select_clients(trainer, run, clients)
        return list(clients)

    def before_round(self, trainer, run) -> None:
        for hook in self.hooks:
            hook.before_round(trainer, run)

    def broadcast_bytes(self, trainer, run, dense: int) -> int:
        for hook in self.hooks:
            dense = hook.broadcast_bytes(trainer, run, dense)
        return dense

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        for hook in self.hooks:
            sent = hook.on_client_message(trainer, ctx, sent)
        return sent

    def after_sums(self, trainer, run, sums) -> None:
        for hook in self.hooks:
            hook.after_sums(trainer, run, sums)

    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        for hook in self.hooks:
            hook.after_aggregate(trainer, run, sums, entry)

    def after_evaluate(self, trainer, run, entry: dict) -> None:
        for hook in self.hooks:
            hook.after_evaluate(trainer, run, entry)

    def after_round(self, trainer, run, entry: dict) -> bool:
        return any([hook.after_round(trainer, run, entry) for hook in self.hooks])  # a list: every hook runs

    def on_checkpoint(self, trainer, run, directory: str) -> None:
        for hook in self.hooks:
            hook.on_checkpoint(trainer, run, directory)

    def on_train_end(self, trainer, run) -> None:
        for hook in self.hooks:
            hook.on_train_end(trainer, run)

    def checkpoint_state(self, trainer, run) -> Tuple[dict, Dict[str, TensorDict]]:
        """Each hook's state under its own key (fedhf/trainer/hooks/hook_state.py)."""
        return hook_state.collect(self.hooks, trainer, run)

    def restore_state(self, trainer, run, meta: dict, groups: Dict[str, TensorDict]) -> None:
        hook_state.hand_back(self.hooks, trainer, run, meta, groups)
