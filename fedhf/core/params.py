"""The federated state of a model: what is sent, averaged and corrected.

Exactly the trainable parameters (``requires_grad``) are federated: LoRA A/B and ``modules_to_save`` heads
under peft, every weight under full fine-tuning. Frozen base weights are never copied per client. Floating
point buffers (BatchNorm running statistics) are averaged like parameters but never corrected or
preconditioned (docs/algorithms.md section 0); integer buffers (``num_batches_tracked``, ``position_ids``) and
non-persistent buffers (constants the model rebuilds itself and never saves, e.g. a causal LM's rotary
``inv_freq``) are not federated.

Quantised bases (QLoRA, bitsandbytes ``Params4bit`` uint8 / ``Int8Params`` int8) are frozen integer parameters, so
they are never sent, averaged or copied; only the adapter and trainable heads are.

Names are the model's own ``named_parameters`` names, which for a peft model are the names peft's
``get_peft_model_state_dict`` is built from, so keys stay consistent with saved adapters.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

TensorDict = Dict[str, torch.Tensor]


def trainable_parameters(model: torch.nn.Module) -> Dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def federated_buffers(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Floating-point buffers that are part of the model's state, e.g. BatchNorm running mean/var (averaged, not
    trained). The state dict's keys tell persistent buffers from non-persistent ones."""
    saved = set(model.state_dict(keep_vars=True))
    return {name: b for name, b in model.named_buffers() if b is not None and b.is_floating_point() and name in saved}


def snapshot(tensors: TensorDict) -> TensorDict:
    """A detached fp32 copy (the server keeps the global model in fp32 whatever the model dtype)."""
    return {name: t.detach().to(torch.float32, copy=True) for name, t in tensors.items()}


@torch.no_grad()
def load_into(targets: TensorDict, values: TensorDict) -> None:
    for name, target in targets.items():
        target.copy_(values[name])


@torch.no_grad()
def difference(current: TensorDict, reference: TensorDict) -> TensorDict:
    """current - reference, in fp32."""
    return {name: current[name].detach().float() - reference[name] for name in reference}


def num_bytes(tensors: TensorDict) -> int:
    """Bytes that sending these tensors costs, computed from the tensors themselves."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def augment(matrix: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """[M | b]: a weight-shaped tensor as (out, in) (conv filters flattened), the bias as one more column (the
    homogeneous coordinate of FOOF's A and FedPM's mixing)."""
    flat = matrix.reshape(matrix.shape[0], -1)
    return flat if bias is None else torch.cat([flat, bias.reshape(-1, 1).to(flat.dtype)], dim=1)
