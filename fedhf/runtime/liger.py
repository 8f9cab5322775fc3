"""``use_liger_kernel``: Liger Kernel's Triton kernels applied to the resident model, on a CUDA GPU.

Liger Kernel (Hsu et al., 2024, arXiv:2410.10989, github.com/linkedin/Liger-Kernel) replaces a supported model's
RMSNorm, RoPE, SwiGLU/GeGLU MLP and cross-entropy with fused Triton kernels, and its causal-LM forward can fuse the
head with the loss. Trainer patches the model when its ``train()`` starts; fedhf's round loop replaces that
``train()``, so the trainer patches the resident model itself, once, when it is built: transformers'
``apply_liger_kernel`` (liger-kernel's ``_apply_liger_kernel_to_instance`` on the model under the peft wrapper,
with ``liger_kernel_config`` as its keywords). Every client then trains and evaluates through the patched modules.

Refused before any work, with the reason: on the CPU (Triton's kernels need a GPU), and where liger-kernel is not
installed (the install command named). fedhf does not depend on it.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import torch

GPU_ONLY = "Liger's kernels are Triton, GPU only: set use_liger_kernel=False on the CPU"
INSTALL = "liger-kernel is not installed: `pip install liger-kernel` (needs a CUDA GPU), or set use_liger_kernel=False"


def liger_refusal(on_gpu: bool, installed: bool) -> Optional[str]:
    """Why ``use_liger_kernel`` cannot be applied (None: it can)."""
    if not on_gpu:
        return GPU_ONLY
    if not installed:
        return INSTALL
    return None


def check_liger(args) -> None:
    """Refuse ``use_liger_kernel`` where it cannot run, before any work."""
    if not args.use_liger_kernel:
        return
    on_gpu = not args.use_cpu and torch.cuda.is_available()
    problem = liger_refusal(on_gpu, importlib.util.find_spec("liger_kernel") is not None)
    if problem:
        raise ValueError(f"`use_liger_kernel`=True: {problem}.")


def apply_liger(model: torch.nn.Module, args) -> None:
    """Patch ``model`` (checked by :func:`check_liger`) with Liger's kernels, as Trainer does at its train()."""
    if args.use_liger_kernel:
        from transformers.integrations.liger import apply_liger_kernel

        apply_liger_kernel(model, args.liger_kernel_config)
