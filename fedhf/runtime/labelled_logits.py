"""A causal LM's head and loss computed only where a label is.

In supervised fine-tuning most label tokens are ``-100`` (the prompt, the padding), yet a causal LM's forward
projects every position onto the whole vocabulary before its loss drops those positions: for Gemma-3-270M
(a 262,144-token vocabulary, 62 % of its parameters) and a 40-token row whose answer is 1-3 tokens, that
projection and its float32 upcast are most of a step. transformers' models take ``logits_to_keep``, and a
``(batch, K)`` integer tensor keeps those positions of each row (``slice_logits_to_keep``, a fixed-size gather);
their loss takes ``shift_labels`` in place of shifting ``labels``. Given both, the model computes the same cross-entropy terms
(the labelled positions are all it ever summed) over far fewer logits: the loss and its gradients are those of
the full forward, up to float rounding (tests/runtime/test_labelled_logits.py).
"""

from __future__ import annotations

import inspect
from typing import Mapping

import torch
import torch.nn.functional as F
from transformers.loss.loss_utils import ForCausalLMLoss

IGNORE = -100


# The causal LMs proven to give their own loss (and its gradients) with ``logits_to_keep`` + ``shift_labels``: each
# is built from a tiny config and compared with its full forward in tests/runtime/test_labelled_logits.py. An
# allow-list, not a rule read off the code: transformers names a model's ``loss_function`` after its class, and 12
# causal LMs (BartForCausalLM, XLNetLMHeadModel, ...) slice their logits yet compute their loss by hand, which fails
# on the cut logits. A model missing here keeps its full forward (same results; add it with its test row).
PROVEN_CAUSAL_LMS = {  # class name -> transformers model_type (the test builds each from the type's tiny config)
    "BloomForCausalLM": "bloom", "CodeGenForCausalLM": "codegen", "CohereForCausalLM": "cohere",
    "Ernie4_5ForCausalLM": "ernie4_5", "Exaone4ForCausalLM": "exaone4", "FalconForCausalLM": "falcon",
    "GPT2LMHeadModel": "gpt2", "GPTBigCodeForCausalLM": "gpt_bigcode", "GPTJForCausalLM": "gptj",
    "GPTNeoXForCausalLM": "gpt_neox", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text",
    "GemmaForCausalLM": "gemma", "Glm4ForCausalLM": "glm4", "GraniteForCausalLM": "granite",
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "MptForCausalLM": "mpt", "OPTForCausalLM": "opt", "Olmo2ForCausalLM": "olmo2", "OlmoForCausalLM": "olmo",
    "Phi3ForCausalLM": "phi3", "PhiForCausalLM": "phi", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "SmolLM3ForCausalLM": "smollm3", "StableLmForCausalLM": "stablelm",
    "Starcoder2ForCausalLM": "starcoder2",
}


def predicts_at_positions(model) -> bool:
    """Whether ``model`` (a peft wrapper or a transformers model) is one of :data:`PROVEN_CAUSAL_LMS` (whose
    forward slices its hidden states with ``slice_logits_to_keep``, which understands a boolean mask, and whose loss
    is the standard causal LM cross-entropy, which reads ``shift_labels``), under no peft prompt learning (prompt
    tuning, P-tuning: peft prepends virtual tokens the mask does not have). Anything else keeps its full forward."""
    peft_config = getattr(model, "active_peft_config", None)  # a PeftModel's; None for a transformers model
    if peft_config is not None and peft_config.is_prompt_learning:
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if type(base).__name__ not in PROVEN_CAUSAL_LMS:
        return False
    forward = inspect.unwrap(type(base).forward)  # under transformers' decorators; a later transformers may change it
    return "slice_logits_to_keep" in forward.__code__.co_names and base.loss_function is ForCausalLMLoss


def at_labelled_positions(inputs: Mapping) -> Mapping:
    """``inputs`` with ``logits_to_keep`` and ``shift_labels`` from :func:`labelled_positions`; unchanged when the
    labels are not per token, the caller already chose positions, or the rows are labelled almost everywhere
    (:data:`FULL_HEAD_ABOVE`: then the full head is as cheap and skips the gathers)."""
    labels = inputs.get("labels")
    if not torch.is_tensor(labels) or labels.ndim != 2 or "logits_to_keep" in inputs or "shift_labels" in inputs:
        return inputs
    positions, shift_labels = labelled_positions(labels)
    if positions.shape[1] > FULL_HEAD_ABOVE * max(labels.shape[1] - 1, 1):
        return inputs
    return {**inputs, "logits_to_keep": positions, "shift_labels": shift_labels}


# The labelled-positions head is used while the most-labelled row of a batch has at most this share of its
# positions labelled; above it the full head is used. Measured on CPU (benchmarks/labelled_head.py, a step of a
# 4-layer Llama with a 30,522-token vocabulary): full over labelled 3.80x at 5 % labelled, 1.55x at 50 %, 1.03x
# at 90 %, 0.96x at 100 % (the gathers then save nothing and cost a little).
FULL_HEAD_ABOVE = 0.9


def labelled_positions(labels: torch.Tensor):
    """Fixed-size gathers for the head at labelled positions: ``positions`` (batch, K) int64, row b's positions t
    whose next token t + 1 has a label, in order, K the most any row has (at least 1), a shorter row padded with
    positions whose ``shift_labels`` entry is -100 (ignored by the loss); ``shift_labels`` (batch, K) those next
    tokens. A 2D integer ``logits_to_keep`` is a ``take_along_dim`` in transformers' ``slice_logits_to_keep``, so
    the model gathers (batch, K) hidden states with no data-dependent shape on the device; K is read where the
    labels are. Call it on the host batch (before it moves to the device) and nothing waits for the device; no
    boolean-mask indexing anywhere (a boolean ``logits_to_keep`` or ``nonzero`` would each wait for it)."""
    keep = labels[:, 1:].ne(IGNORE)  # position t predicts token t + 1
    most = max(int(keep.sum(1).max()), 1) if keep.numel() else 1
    order = torch.argsort(keep.logical_not().to(torch.uint8), dim=1, stable=True)[:, :most]  # labelled first
    shift_labels = torch.where(keep.gather(1, order), labels[:, 1:].gather(1, order), IGNORE)
    return order, shift_labels


def row_losses_at(logits: torch.Tensor, shift_labels: torch.Tensor) -> torch.Tensor:
    """Per row, the summed cross-entropy (fp32) of the logits a forward with the ``logits_to_keep`` positions of
    :func:`labelled_positions` returned, (batch, K, vocabulary) against its ``shift_labels`` (batch, K): what the
    full forward's per-row loss sums. Only the kept positions are upcast."""
    tokens = F.cross_entropy(logits.float().flatten(0, 1), shift_labels.flatten(), ignore_index=IGNORE,
                             reduction="none")
    return tokens.view(shift_labels.shape).sum(1)
