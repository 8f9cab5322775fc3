"""The parameter-sharing axis: which trainable tensors are shared, personal or frozen (the sharing plan), a LoRA
factor frozen round by round (alternating factors: RoLoRA, FedSVD's A) and per-client LoRA ranks.

Import rule: :mod:`fedhf.core` and :mod:`fedhf.runtime` only; no other axis (tests/test_layout.py).
"""
