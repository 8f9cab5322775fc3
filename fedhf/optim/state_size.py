"""Declared optimizer-state sizes: the bytes a local optimizer holds per client, computed from the parameters'
shapes and dtypes without building the optimizer (the memory plan, fedhf/trainer/runners/memory_plan.py, multiplies them by the
clients trained at once). tests/optim/test_conformance.py checks every declaration against the real state after
one step.

fedhf's own optimizers declare theirs as the classmethod ``state_bytes(params, **kwargs)``; ``torch.optim`` classes
are declared here (:data:`TORCH_STATE_BYTES`), read from torch's own ``_init_group`` code: AdamW/Adam keep
``exp_avg``, ``exp_avg_sq`` (+ ``max_exp_avg_sq`` with ``amsgrad``) in the parameter's dtype and a float32 ``step``
scalar; SGD keeps one ``momentum_buffer`` (only with momentum).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping

import torch

Params = Mapping[str, torch.Tensor]
STEP_BYTES = 4  # torch.optim's per-parameter ``step`` is a float32 scalar tensor (not capturable, not fused)


def nbytes(numel: int, dtype: torch.dtype) -> int:
    return numel * torch.empty((), dtype=dtype).element_size()


def state_dtype(p: torch.Tensor) -> torch.dtype:
    """fp32 for half-precision parameters, the parameter's own from fp32 up (FederatedOptimizer.lazy_state)."""
    return torch.promote_types(p.dtype, torch.float32)


def copies(params: Params, n: int, dtype_of: Callable[[torch.Tensor], torch.dtype] = lambda p: p.dtype) -> int:
    """``n`` parameter-shaped tensors per parameter."""
    return sum(n * nbytes(p.numel(), dtype_of(p)) for p in params.values())


def _adam(params: Params, kwargs: Mapping[str, Any]) -> int:
    moments = 3 if kwargs.get("amsgrad", False) else 2
    return copies(params, moments) + STEP_BYTES * len(params)


def _sgd(params: Params, kwargs: Mapping[str, Any]) -> int:
    return copies(params, 1) if kwargs.get("momentum", 0) else 0


#: torch.optim class -> bytes of its state for ``params`` built with ``kwargs``.
TORCH_STATE_BYTES: Dict[type, Callable[[Params, Mapping[str, Any]], int]] = {
    torch.optim.AdamW: _adam, torch.optim.Adam: _adam, torch.optim.SGD: _sgd}


def adamw_bytes(params: Params) -> int:
    """torch.optim.AdamW with its defaults (MuonAdamW's non-matrix part)."""
    return _adam(params, {})
