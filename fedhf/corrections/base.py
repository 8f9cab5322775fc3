"""The correction axis: how the local step is steered toward the global one.

A correction has a client half (hooks around the optimizer step) and a server half (the state it keeps and
broadcasts). Where the hooks sit in a local step::

    loss.backward()
    clip_grad_norm_(max_grad_norm)      # the raw minibatch gradient is clipped first, as in the papers' code
    correction.before_step(ctx, state)  # "before preconditioning": edits p.grad (FedProx, SCAFFOLD, FedCM)
    optimizer.step()
    correction.after_step(ctx, state)   # "after preconditioning": rewrites the update (FedPAC/FedMuon mixing)

Because the hooks only touch ``p.grad`` and ``p``, every correction works with every optimizer. What a correction
keeps for one client over one round (SCAFFOLD's c_i and its constant shift c - c_i) is a value too:
``state = client_begin(ctx)`` returns it (``None`` for a correction that keeps nothing: each declares its own
type, e.g. :class:`fedhf.corrections.control_variate.VariateRound`), and the caller hands it back to
``before_step``, ``after_step`` and ``client_end``. The correction object itself holds only its settings, so one
object serves any number of clients at once (batched clients train side by side). At the end of the round
``client_end(ctx, state)`` returns the correction's message (a value; the trainer namespaces it ``correction.``);
``server_update`` reads the sums of those messages in ``ctx.sums``.
"""

from __future__ import annotations

from abc import ABC
from typing import Any, Dict

import torch

from ..core.context import ClientContext, ServerContext
from ..core.message import Message
from ..core.params import TensorDict


class Correction(ABC):
    """The correction protocol, and itself "no correction": every hook is a no-op. Subclasses override only the
    hooks they need."""

    name = "none"
    #: The local optimizer runs at ``lr_scale * eta_r`` (global-direction mixing uses 1 - beta).
    lr_scale = 1.0
    #: Keeps state in parameter coordinates from round to round (SCAFFOLD's c, c_i; a global direction; tracking's
    #: y, y_i), which a server rule that re-factorises LoRA every round would invalidate (checked at compose).
    carries_state = False

    def server_init(self, global_params: TensorDict) -> TensorDict:
        """State the server keeps and broadcasts to the round's clients (its bytes count as downlink)."""
        return {}

    def sent_shapes(self, global_params: TensorDict) -> Dict[str, torch.Size]:
        """The tensors ``client_end``'s message carries, by key and shape, known before any client has sent one
        (client-level DP noises a round that no client sent in on them: fedhf/trainer/hooks/privacy.py)."""
        return {}

    def client_state_bytes(self, global_params: TensorDict) -> int:
        """Bytes this correction keeps per client in the client store (the memory plan, fedhf/trainer/runners/memory_plan.py)."""
        return 0

    def client_begin(self, ctx: ClientContext) -> Any:
        """The client's state for this round (``None``: nothing to keep), handed back to the other client hooks."""
        return None

    def before_step(self, ctx: ClientContext, state: Any) -> None:
        pass

    def after_step(self, ctx: ClientContext, state: Any) -> None:
        pass

    def client_end(self, ctx: ClientContext, state: Any) -> Message:
        """What the server half needs from this client (the model change itself is sent by the trainer)."""
        return Message()

    def server_update(self, state: TensorDict, ctx: ServerContext) -> TensorDict:
        return state

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"
