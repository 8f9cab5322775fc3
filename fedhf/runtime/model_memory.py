"""What a model itself holds in memory, measured or estimated from the model alone: its parameters and buffers by
dtype (quantised bitsandbytes weights with their constants), the activations a token keeps for the backward (the
formula of fedhf/trainer/runners/memory_plan.py's docstring), the half-precision copies autocast keeps, and the peak of
the tensors a piece of code allocates (torch's profiler). The run's plan, which adds what federation holds, is
fedhf/trainer/runners/memory_plan.py."""

from __future__ import annotations

import json
import sys
from typing import Callable, Dict, Optional

import torch


def model_bytes(model: torch.nn.Module) -> Dict[str, int]:
    """Bytes of the model's parameters and buffers by dtype, each storage once (tied weights), quantised
    bitsandbytes weights at their stored size plus their quantisation constants (``absmax``...). An FSDP-sharded
    parameter (a DTensor) counts its local shard: what this process holds."""
    from torch.distributed.tensor import DTensor

    out: Dict[str, int] = {}
    seen = set()
    for tensor in list(model.parameters()) + list(model.buffers()):
        tensor = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if tensor.device.type != "meta":
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.dtype)
            if key in seen:
                continue
            seen.add(key)
        dtype = str(tensor.dtype).replace("torch.", "")
        out[dtype] = out.get(dtype, 0) + tensor.numel() * tensor.element_size()
        for name, extra in quantisation_constants(tensor).items():
            out[name] = out.get(name, 0) + extra
    return out


def quantisation_constants(tensor: torch.Tensor) -> Dict[str, int]:
    """The constants a bitsandbytes 4-bit weight keeps beside its packed bytes (absmax, and its own absmax under
    double quantisation), by dtype; {} for every other tensor."""
    bnb = sys.modules.get("bitsandbytes")  # not loaded: no quantised weights either
    if bnb is None or not isinstance(tensor, bnb.nn.Params4bit) or tensor.quant_state is None:
        return {}
    state, out = tensor.quant_state, {}
    for part in (state.absmax, state.code, *((state.state2.absmax, state.state2.code) if state.nested else ())):
        dtype = str(part.dtype).replace("torch.", "")
        out[dtype] = out.get(dtype, 0) + part.numel() * part.element_size()
    return out


def activation_elements_per_token(config, checkpointing: bool, logits_width: int) -> Optional[int]:
    """The formula of the module docstring; None for a config without hidden_size / num_hidden_layers."""
    hidden, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    if not isinstance(hidden, int) or not isinstance(layers, int):
        return None
    width = getattr(config, "intermediate_size", None) or 4 * hidden
    layer = 8 * hidden + 4 * width
    kept = layers * hidden + layer if checkpointing else layers * layer
    return kept + logits_width + hidden


def peak_tensor_bytes(run: Callable[[], object], trace_path: str) -> int:
    """What the plan counts, measured: the most bytes of CPU tensors that ``run()`` allocated and held at once, from
    torch's profiler ("Total Allocated" at every allocation and free; its trace is written to ``trace_path``).
    Neither other processes nor memory a warm heap reuses disturb it, as they do a resident-set peak; memory a
    library allocates outside torch's allocator (BLAS buffers) is not in it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        run()
    profiler.export_chrome_trace(str(trace_path))
    with open(trace_path) as trace:
        events = [e["args"] for e in json.load(trace)["traceEvents"]
                  if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    if not events:
        return 0
    before = events[0]["Total Allocated"] - events[0]["Bytes"]  # what earlier code still held when profiling began
    return max(e["Total Allocated"] for e in events) - before


def floating_size(model: torch.nn.Module) -> int:
    """Bytes per element of the model's floating-point parameters (its first one's dtype)."""
    floating = [p.dtype for p in model.parameters() if p.is_floating_point()]
    return torch.empty((), dtype=floating[0]).element_size()


def autocast_copy_bytes(model: torch.nn.Module, half_autocast: bool) -> int:
    """Under bf16/fp16 autocast, the half-precision copy of every frozen linear weight wider than 2 bytes that
    the forward multiplies with, kept for the backward (once per forward, whatever the rows)."""
    if not half_autocast:
        return 0
    return sum(2 * m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)
               and not m.weight.requires_grad and m.weight.is_floating_point() and m.weight.element_size() > 2)
