"""Error feedback: over any number of rounds, what was sent plus the last residual is what would have been sent
uncompressed (the telescoping identity), exactly where every value is representable, and to float64 rounding
otherwise; without feedback nothing is kept."""

from __future__ import annotations

import pytest
import torch

from fedhf.compression import build_compressor, compress_step

SPECS = ["none", "bf16", "fp16", "int8", "int4", "int2", "topk:0.05", "powersgd:2"]


def _messages(rounds: int, dyadic: bool):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(rounds):
        if dyadic:  # k / 1024 with |k| < 4096: every sum below is exact in float64, every value exact in fp32
            out.append(torch.randint(-4095, 4096, (24, 16), generator=g).double() / 1024)
        else:
            out.append(torch.randn(24, 16, generator=g, dtype=torch.float64) * 1e-3)
    return out


def _run(spec: str, messages, feedback=True):
    compressor, residual, state, sent_total = build_compressor(spec), None, None, torch.zeros(24, 16,
                                                                                               dtype=torch.float64)
    for t, x in enumerate(messages):
        sent, residual, encoded = compress_step(x, residual, compressor, torch.Generator().manual_seed(t), state,
                                                feedback)
        state = encoded.state
        sent_total = sent_total + sent
    return sent_total, residual


@pytest.mark.parametrize("spec", ["none", "bf16", "fp16", "topk:0.05"])
def test_sent_plus_residual_is_the_uncompressed_sum_exactly(spec):
    """Compressors whose output is a rounding or a subset of their input: c - sent is exact, so the identity is
    bit for bit on values every step represents exactly."""
    messages = _messages(6, dyadic=True)
    sent_total, residual = _run(spec, messages)
    assert torch.equal(sent_total + residual, sum(messages))
    if spec != "none":
        assert residual.abs().sum() > 0  # something was held back


@pytest.mark.parametrize("spec", SPECS)
def test_sent_plus_residual_is_the_uncompressed_sum_to_float64_rounding(spec):
    messages = _messages(6, dyadic=False)
    sent_total, residual = _run(spec, messages)
    total = sum(messages)
    assert (sent_total + residual - total).abs().max() <= 1e-13 * max(float(m.abs().max()) for m in messages) * 6


def test_the_identity_fails_without_feedback():
    """The test above can fail: without feedback the dropped part is lost."""
    messages = _messages(6, dyadic=True)
    sent_total, residual = _run("topk:0.05", messages, feedback=False)
    assert residual is None
    assert not torch.allclose(sent_total, sum(messages))


def test_feedback_shrinks_the_accumulated_error_of_a_biased_compressor():
    """Top-k without feedback drops the same small entries every round; with feedback they are sent later, so the
    error of the accumulated sum is the last residual only (bounded), not growing with the rounds."""
    x = _messages(1, dyadic=False)[0]
    errors = {}
    for rounds in (30, 60):
        messages = [x] * rounds
        with_ef, residual = _run("topk:0.05", messages)
        without, _ = _run("topk:0.05", messages, feedback=False)
        total = sum(messages)
        assert torch.allclose(with_ef - total, -residual)
        errors[rounds] = float((with_ef - total).norm()), float((without - total).norm())
    assert errors[60][1] > 1.9 * errors[30][1]  # without feedback: grows with the rounds
    assert errors[60][0] < 1.2 * errors[30][0] and errors[60][0] < 0.2 * errors[60][1]  # with it: bounded
