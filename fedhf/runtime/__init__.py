"""Model and machine helpers below the axes: processes, determinism, quantised bases, activation checkpointing,
model outputs, stacked per-client adapters, the model's LoRA layers and hardware probes.

Import rule: only :mod:`fedhf.core` (tests/test_layout.py).
"""
