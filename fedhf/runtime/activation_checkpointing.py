"""Activation (gradient) checkpointing in the round loop.

Trainer switches it on inside its own training loop, which FederatedTrainer replaces, so without this the
``gradient_checkpointing``/``activation_checkpointing`` settings would be silently dropped. Same semantics as
Trainer (transformers 5: ``every_n_layers`` and ``offload`` are read from the kwargs, the rest go to
``torch.utils.checkpoint``). With a frozen input embedding (LoRA, QLoRA) a reentrant checkpoint would see inputs
that need no gradient and pass none back to the adapters inside the block; making the embedding output require
grad is peft's fix (``prepare_model_for_kbit_training`` does the same).
"""

from __future__ import annotations

import torch


def enable_activation_checkpointing(model: torch.nn.Module, args) -> bool:
    """Switch checkpointing on as ``args`` ask (``activation_checkpointing``; TrainingArguments resolves its
    deprecated alias ``gradient_checkpointing`` into it). Returns whether it is on."""
    if not args.activation_checkpointing:
        return False
    kwargs = dict(args.activation_checkpointing_kwargs or {})
    every_n_layers, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "activation_checkpointing_enable"):
        raise ValueError(f"`gradient_checkpointing=True` needs a transformers model (activation_checkpointing_enable); "
                         f"{type(model).__name__} has none. Turn it off or checkpoint the model yourself.")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None,
                                          every_n_layers=every_n_layers, offload=offload)
    embeddings = model.get_input_embeddings()
    if embeddings is not None and not any(p.requires_grad for p in embeddings.parameters()):
        model.enable_input_require_grads()
    return True
