"""A warning for the most common first mistake of an LLM user: an SGD algorithm at an AdamW-scale learning rate.

The classic federated algorithms (fedavg, fedprox, scaffold, fedadam, ...) train their clients with plain SGD,
whose useful lr is around 0.1; a trl/peft user's habit is 1e-3 to 2e-4, an AdamW lr. With it SGD barely moves a
LoRA adapter: Gemma-3-270M SFT with fedavg at 1e-3 went from eval loss 18.64 to 18.63 in 2 rounds, where FAdam-GT
at 1e-3 reached 0.65 generation accuracy in 8 (docs/llm.md, "Choosing an algorithm and a learning rate"). It is a
warning, not a refusal: a small SGD lr can be deliberate.
"""

from __future__ import annotations

from typing import Optional

from transformers.utils import logging

logger = logging.get_logger(__name__)

SGD_LR_FLOOR = 1e-2  # below it, an SGD client's lr is an AdamW habit rather than an SGD choice


def sgd_lr_message(model, algorithm) -> Optional[str]:
    """The warning for a causal LM trained by SGD clients below SGD_LR_FLOOR, or None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    local = algorithm.local_optimizer
    if not type(base).__name__.endswith("ForCausalLM") or local.optimizer != "sgd" or local.lr >= SGD_LR_FLOOR:
        return None
    return (f"algorithm {algorithm.name!r} trains its clients with SGD, and learning_rate={local.lr:g} is an "
            "AdamW-scale lr at which SGD barely moves a causal LM: use algorithm='fadam_gt' or 'local_adamw' at "
            "learning_rate=1e-3, or keep SGD at 0.1 or more (docs/llm.md, choosing an algorithm).")


def warn_sgd_lr(trainer) -> None:
    message = sgd_lr_message(trainer.model, trainer.algorithm)
    if message:
        logger.warning(message)
