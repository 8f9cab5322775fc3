"""The server axis: an aggregator followed by a chain of transforms (docs/algorithms.md 4.2).

    D     = aggregator.aggregate(ctx)           mean, median, trimmed mean, preconditioned mixing
    D     = transform.step(D, state, ctx)       for each transform in order: lr, momentum, adam/yogi/adagrad, ...
    x^{r+1} = x^r + D

so FedAdam is ``mean+adam`` and a robust FedAvgM is ``median+momentum``. Every part takes the same inputs: the
round's :class:`fedhf.core.context.ServerContext` (with ``mean_delta``, the ``gathered`` updates when the aggregator
gathers, and the sums of the server rule's own client messages). An aggregator may have a client half
(:meth:`Aggregator.client_end`, FedPM's preconditioner upload), which returns a :class:`fedhf.core.message.Message`.

The chain's state (kept by the server, checkpointed, never broadcast) is keyed by transform name:
``adam.m.<param>``, ``adam.v.<param>``, ``momentum.v.<param>``. A name that occurs again in one chain is numbered
from its second occurrence on (``momentum+momentum``: ``momentum.v.*`` and ``momentum#2.v.*``), so the keys are
unique and follow from the chain alone. Checkpoints written before the state was keyed by name keyed it by position
(``0.m.<param>``); :meth:`ServerRule.load_state` renames them on resume.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, Sequence, Tuple

from ..core.context import ClientContext, ServerContext
from ..core.message import Message
from ..core.params import TensorDict


class Aggregator(ABC):
    """How the round's client updates become one direction D."""

    name = "aggregator"
    #: Needs each client's update (robust statistics), not only sums: the trainer gathers them (fedhf.core.sums).
    gathers = False
    #: Needs the local optimizer's :meth:`~fedhf.optim.base.OptimizerHooks.preconditioners` (checked at compose).
    needs_preconditioners = False
    #: Changes the frozen base weights of LoRA layers (FedEx-LoRA): the trainer folds :meth:`base_residual` into them.
    folds_into_base = False
    #: Aggregates LoRA products B_i A_i (fedhf/server/lora.py): every LoRA A and B must be shared.
    needs_lora_pairs = False
    #: Each client sends its whole LoRA product w_i B_i A_i (an absolute state, not a change): DP's clip and fixed
    #: denominator, meant for changes, would rescale the adapter itself (refused under DP).
    sends_products = False
    #: Clients train only LoRA B; A is frozen on every client and set by the server alone (FedSVD).
    freezes_lora_a = False
    #: Rebuilds LoRA A and B in a new basis every round with the same product (FlexLoRA's and FedSVD's SVD, FLoRA's
    #: restart): state kept in A/B coordinates across rounds would be applied in the wrong basis (checked at compose).
    refactorises_lora = False

    def client_end(self, ctx: ClientContext, optimizer) -> Message:
        """The client half: what this aggregator needs beyond the model change. Nothing by default."""
        return Message()

    @abstractmethod
    def aggregate(self, ctx: ServerContext) -> TensorDict:
        """D, one tensor per name of ``ctx.global_params``."""

    def base_residual(self, new_params: TensorDict, ctx: ServerContext) -> TensorDict:
        """What to fold into each adapted layer's base weight, keyed by the name of its LoRA A, before the scale
        alpha/r (only with ``folds_into_base``; :class:`fedhf.runtime.lora_layers.BaseFold` applies it)."""
        return {}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "name")
        return f"{type(self).__name__}({fields})"


class ServerTransform(ABC):
    """Turns a direction into a step, keeping its own state between rounds."""

    name = "transform"

    def init(self, global_params: TensorDict) -> TensorDict:
        """The transform's state at round 0 (kept by the server, checkpointed, never broadcast)."""
        return {}

    @abstractmethod
    def step(self, direction: TensorDict, state: TensorDict, ctx: ServerContext) -> Tuple[TensorDict, TensorDict]:
        """(step, new state) from the direction."""

    def apply(self, x: TensorDict, direction: TensorDict, state: TensorDict,
              ctx: ServerContext) -> Tuple[TensorDict, TensorDict]:
        """x + step: the transform alone as a server update (as the last of a chain does)."""
        step, state = self.step(direction, state, ctx)
        return {n: x[n] + step[n] for n in x}, state

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "name")
        return f"{type(self).__name__}({fields})"


class ServerRule:
    """The server-rule protocol: ``init``, ``client_end`` (the aggregator's client half), ``apply``."""

    def __init__(self, aggregator: Aggregator, transforms: Sequence[ServerTransform], name: str = "") -> None:
        if not transforms:
            raise ValueError("A server rule needs at least one transform (e.g. `lr`, the plain step).")
        self.aggregator, self.transforms = aggregator, tuple(transforms)
        self.name = name or "+".join([aggregator.name] + [t.name for t in self.transforms])
        self._heads = state_heads([t.name for t in self.transforms])

    @property
    def gathers(self) -> bool:
        return self.aggregator.gathers

    @property
    def folds_into_base(self) -> bool:
        return self.aggregator.folds_into_base

    def base_residual(self, new_params: TensorDict, ctx: ServerContext) -> TensorDict:
        return self.aggregator.base_residual(new_params, ctx)

    def init(self, global_params: TensorDict) -> TensorDict:
        """Every transform's state, keyed ``<head>.<key>`` (:func:`state_heads`: the transform's name, numbered
        from its second occurrence in the chain)."""
        return {f"{head}.{k}": v for head, t in zip(self._heads, self.transforms)
                for k, v in t.init(global_params).items()}

    def load_state(self, state: TensorDict) -> TensorDict:
        """A checkpoint's chain state in today's keys: position keys (``0.m.<param>``, written before the state was
        keyed by name) are renamed to the transform at that position; a key of no transform of this chain is
        refused, not dropped (the checkpoint was written by another chain)."""
        return {rename_state_key(key, self._heads): value for key, value in state.items()}

    def client_end(self, ctx: ClientContext, optimizer) -> Message:
        return self.aggregator.client_end(ctx, optimizer)

    def apply(self, x: TensorDict, state: TensorDict, ctx: ServerContext) -> Tuple[TensorDict, TensorDict]:
        direction, new_state = self.aggregator.aggregate(ctx), {}
        for name, transform in zip(self._heads, self.transforms):
            head = f"{name}."
            own = {k[len(head):]: v for k, v in state.items() if k.startswith(head)}
            direction, own = transform.step(direction, own, ctx)
            new_state.update({head + k: v for k, v in own.items()})
        return {n: x[n] + direction[n] for n in x}, new_state

    def __repr__(self) -> str:
        return f"ServerRule({self.aggregator!r} -> {', '.join(map(repr, self.transforms))})"


def state_heads(names: Sequence[str]) -> Tuple[str, ...]:
    """Each transform's state prefix: its name, and ``<name>#<k>`` for its k-th occurrence (k >= 2) in the chain."""
    seen: Dict[str, int] = {}
    heads = []
    for name in names:
        # the prefix is cut at the first ".", and an all-digit prefix is an old position key
        if "." in name or "#" in name or name.isdigit():
            raise ValueError(f"A server transform's name keys its state: {name!r} must not contain '.' or '#' "
                             "nor be a number.")
        seen[name] = seen.get(name, 0) + 1
        heads.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return tuple(heads)


def rename_state_key(key: str, heads: Sequence[str]) -> str:
    """``key`` of a chain's state with ``heads`` (:func:`state_heads`), a position key ``<i>.<rest>`` renamed to
    ``<heads[i]>.<rest>``; raises ValueError for a key of no transform of the chain."""
    head, dot, rest = key.partition(".")
    if dot and head in heads:
        return key
    if dot and head.isdigit() and int(head) < len(heads):
        return f"{heads[int(head)]}.{rest}"
    raise ValueError(f"Server state key {key!r} belongs to no transform of this server rule (keys start with one "
                     f"of {list(heads)}, or a position 0..{len(heads) - 1} in checkpoints written before the state "
                     "was keyed by name): the checkpoint was written with another `server_rule`; resume with that "
                     "rule, or start a new run in another output_dir.")
