"""The memory of a causal LM's head and its loss, for the memory plan's row "logits" (its module docstring,
fedhf/trainer/runners/memory_plan.py, says what each count rests on): the loss over materialised logits, trl's fused
LM head, and a local optimizer's pass over every position's logits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: fp32 logits-sized tensors a step holds at once around a cross-entropy (fedhf/trainer/runners/memory_plan.py, row "logits")
LOSS_LOGITS = 3
#: trl 1.16's tiles (trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE, trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE)
TRL_TOKEN_TILE, TRL_VOCAB_TILE = 4096, 32768
#: fp32 tile-sized tensors trl's fused head holds at once (fedhf/trainer/runners/memory_plan.py, row "logits")
FUSED_TILES = 8


@dataclass(frozen=True)
class HeadShape:
    """The worst micro-batch's head: ``rows`` rows padded to ``length`` tokens (the collators pad a batch to its
    longest row, so the batch holding the longest row is the largest), ``labelled`` labelled positions at most
    (the rows with the most labels; None without a per-token ``labels`` column), a vocabulary of ``vocabulary``
    after a hidden state of ``hidden``, logits in half precision (``half``) or fp32."""

    rows: int
    length: int
    labelled: Optional[int]
    vocabulary: int
    hidden: int
    half: bool

    @property
    def every(self) -> int:
        return self.rows * self.length

    @property
    def scored(self) -> int:
        return self.every if self.labelled is None else self.labelled


def cross_entropy_bytes(head: HeadShape, labelled_only: bool) -> int:
    """A causal LM's loss over materialised logits: ``LOSS_LOGITS`` fp32 logits-sized tensors at the labelled
    positions (``logits_at_labels_only``) or at every position, per client; batched clients' per-row losses
    (fedhf/runtime/stacked_adapters.py) keep no more since the stacked modules are reused across chunks (measured:
    3.0 per client at 2 batched clients, where it was 3.9 when each chunk built its own)."""
    return LOSS_LOGITS * (head.scored if labelled_only else head.every) * head.vocabulary * 4


def logits_pass_bytes(head: HeadShape, kind: str) -> int:
    """A pass through ``ModelAccess.logits``. ``"backward"`` (Sophia's GNB, fedhf/optim/sophia.py): every
    position's logits in the head's dtype and the copy that drops each row's last one (their two gradients in
    the backward), then the labelled rows in fp32 (the upcast, the softmax, the log-softmax and its gradient).
    ``"no_grad"`` (FOOF's statistics, fedhf/optim/foof.py): every position's logits, and nothing kept for a
    backward (the caller sets the activations against it)."""
    logits = head.every * head.vocabulary * (2 if head.half else 4)
    return 2 * logits + 4 * head.scored * head.vocabulary * 4 if kind == "backward" else logits


def fused_head_bytes(head: HeadShape, labelled_only: bool) -> int:
    """trl's fused LM head (trl.kernels.chunked_logprob, trl 1.16): the positions' log-probabilities computed in
    tiles of at most ``TRL_TOKEN_TILE`` positions x ``TRL_VOCAB_TILE`` tokens; ``FUSED_TILES`` fp32 tile-sized
    tensors at once in its backward on CPU, beside the fp32 copy of a vocabulary slice of the head's weight and
    the fp32 gradient of the hidden states. Every position is scored, or only the labelled ones where trl runs
    its Triton kernels (``labelled_only``)."""
    positions = head.scored if labelled_only else head.rows * max(head.length - 1, 0)
    vocab_tile = min(head.vocabulary, TRL_VOCAB_TILE)
    tile = min(positions, TRL_TOKEN_TILE) * vocab_tile
    return 4 * (FUSED_TILES * tile + vocab_tile * head.hidden + positions * head.hidden)


def trl_scores_labelled_only(args) -> bool:
    """trl scores only the labelled positions where it runs Triton (CUDA, XPU), every position elsewhere."""
    from transformers.utils import is_triton_available

    return args.device.type in ("cuda", "xpu") and is_triton_available()
