"""Decoded optimizer states keep their domain: a non-negative state is clamped at 0, a symmetric PSD one is the
nearest PSD matrix, a general one is untouched; in the uplink hook, error feedback's identity (sent + residual =
input + prior residual) still holds for a state that int2 + error feedback would send negative."""

from __future__ import annotations

import torch

from fedhf.compression import compress_step
from fedhf.compression.domain import keep_domain
from fedhf.core.message import Message
from fedhf.core.theta import GENERAL, NONNEGATIVE, SYMMETRIC_PSD
from fedhf.optim.amsgrad import AMSGradNoBias
from fedhf.trainer.hooks.compression import Compression, _Draws


def test_each_kind_is_put_back_in_its_domain():
    x = torch.tensor([[-1.0, 2.0], [0.5, -0.25]])
    assert torch.equal(keep_domain(x, NONNEGATIVE), torch.tensor([[0.0, 2.0], [0.5, 0.0]]))
    assert torch.equal(keep_domain(x, GENERAL), x)
    indefinite = torch.tensor([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and -1, eigenvectors (1, +-1)/sqrt 2
    projected = keep_domain(indefinite, SYMMETRIC_PSD)
    assert torch.allclose(projected, torch.full((2, 2), 1.5), atol=1e-6)  # 3 (1, 1)(1, 1)^T / 2
    psd = torch.tensor([[2.0, 1.0], [1.0, 2.0]])
    assert torch.allclose(keep_domain(psd, SYMMETRIC_PSD), psd, atol=1e-6)  # already PSD: unchanged


def test_uplink_int2_with_feedback_sends_a_nonnegative_second_moment_and_keeps_the_ef_identity():
    hook = Compression("sync.*=int2", None, error_feedback=True, optimizer=AMSGradNoBias)
    assert hook.kind("sync.theta.exp_avg_sq:layer.weight") == NONNEGATIVE
    assert hook.kind("sync.theta.exp_avg:layer.weight") == GENERAL and hook.kind("dx.layer.weight") == GENERAL
    v = torch.rand(64, generator=torch.Generator().manual_seed(0)) * 1e-3
    prior = torch.where(torch.arange(64) % 2 == 0, -2.0 * v, torch.zeros(64)).double()  # pulls half below 0
    key = "sync.theta.exp_avg_sq:layer.weight"
    draws = _Draws(0, 0, 0, 0xC0, "cpu")
    unprojected, _, _ = compress_step(v.double(), prior, hook.uplink.pick(key), draws.of(key))
    residuals = {key: prior}
    out = hook._compress(Message().put("theta", {"exp_avg_sq:layer.weight": v}), "sync", residuals, {}, draws)
    sent = out.tensors["theta.exp_avg_sq:layer.weight"]
    assert bool((unprojected < 0).any()) and bool((sent >= 0).all())  # int2 + EF alone would send negatives
    assert torch.allclose(sent + residuals[key], v.double() + prior, atol=1e-12)


def test_downlink_powersgd_broadcasts_a_nonnegative_second_moment():
    """The clients' held copy x_hat + decode(C(x - x_hat)) of a non-negative state: rank 1 of a signed difference
    has negative entries (as an optimizer with general states gets it), the projected one has none."""
    generator = torch.Generator().manual_seed(1)
    first, second = (torch.rand(6, 5, generator=generator) ** 3 for _ in range(2))
    held = {}
    for optimizer in (None, AMSGradNoBias):
        hook = Compression(None, "sync.*=powersgd:1", error_feedback=True,
                           **({"optimizer": optimizer} if optimizer else {}))
        state = {}
        for r, x in enumerate((first, second)):
            got, _ = hook._held({"exp_avg_sq:layer.weight": x}, "sync", state, _Draws(0, r, 0, 0xC1, "cpu"))
        held[optimizer] = got["exp_avg_sq:layer.weight"]
    assert bool((held[None] < 0).any()) and bool((held[AMSGradNoBias] >= 0).all())
