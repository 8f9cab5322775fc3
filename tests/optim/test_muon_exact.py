"""Muon's other forms (fedhf.optim.muon_exact): FedMuon's Algorithm 1 (sum-form momentum, exact SVD polar factor)
and the equivalences docs/algorithms.md 1.3 states."""

from __future__ import annotations

import pytest
import torch

from fedhf.optim import MuonAdamW
from fedhf.optim.muon_exact import ExactMuon, polar_factor


def _grads(n, shape=(6, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


def _trajectory(optimizer_cls, grads, start, **kwargs):
    p = torch.nn.Parameter(start.clone())
    optimizer = optimizer_cls([p], **kwargs)
    for g in grads:
        p.grad = g.clone()
        optimizer.step()
    return p.detach(), optimizer.state[p]["momentum_buffer"]


@pytest.mark.parametrize("nesterov", [True, False])
def test_ema_ns5_is_torch_muon_bit_for_bit(nesterov):
    start, grads = torch.randn(6, 4), _grads(3)
    kwargs = dict(lr=0.02, momentum=0.95, nesterov=nesterov, weight_decay=0.01)
    ours, ours_buf = _trajectory(ExactMuon, grads, start, **kwargs)
    ref, ref_buf = _trajectory(torch.optim.Muon, grads, start, **kwargs)
    assert torch.equal(ours, ref) and torch.equal(ours_buf, ref_buf)


def test_svd_step_is_the_polar_factor_of_the_sum_form_momentum():
    """FedMuon Alg. 1: M <- beta M + G ; x <- x - eta U V^T (shape scale sqrt(max(1, rows/cols)), torch's)."""
    start, grads, lr, mu = torch.randn(6, 4, dtype=torch.float64), _grads(2, seed=1), 0.1, 0.9
    grads = [g.double() for g in grads]
    got, buf = _trajectory(ExactMuon, grads, start, lr=lr, momentum=mu, nesterov=False, momentum_form="sum",
                           ortho="svd")
    x, M = start.clone(), torch.zeros_like(start)
    for g in grads:
        M = mu * M + g
        u, _, vh = torch.linalg.svd(M, full_matrices=False)
        x = x - lr * (6 / 4) ** 0.5 * (u @ vh)
    torch.testing.assert_close(buf, M)
    torch.testing.assert_close(got, x)
    step = (start - got) / (lr * 1.5 ** 0.5)  # the first step's direction is orthogonal: singular values 1
    assert torch.allclose(torch.linalg.svdvals(polar_factor(grads[0])), torch.ones(4, dtype=torch.float64))
    assert step.abs().max() > 0


@pytest.mark.parametrize("nesterov", [False, True])
def test_sum_and_ema_forms_take_the_same_steps(nesterov):
    """Orthogonalisation ignores the scale of U, so only the buffers differ, by 1 / (1 - mu) (docs/algorithms.md 1.3);
    with Nesterov too: B_sum = B_ema / (1 - mu), so U_sum = G + mu B_sum = U_ema / (1 - mu), the same direction
    (fedhf/optim/muon_step.py writes both forms)."""
    start, grads, mu = torch.randn(6, 4, dtype=torch.float64), [g.double() for g in _grads(3, seed=2 + nesterov)], 0.9
    kwargs = dict(lr=0.05, momentum=mu, nesterov=nesterov, ortho="svd")
    sums, sum_buf = _trajectory(ExactMuon, grads, start, momentum_form="sum", **kwargs)
    emas, ema_buf = _trajectory(ExactMuon, grads, start, momentum_form="ema", **kwargs)
    torch.testing.assert_close(sums, emas)
    torch.testing.assert_close(sum_buf * (1 - mu), ema_buf)
    if nesterov:
        plain, _ = _trajectory(ExactMuon, grads, start, **{**kwargs, "nesterov": False}, momentum_form="sum")
        assert not torch.allclose(sums, plain)  # Nesterov changed the steps: the comparison above is not vacuous


def test_a_zero_momentum_gives_no_step():
    """NS5(0) = 0 thanks to its eps; the polar factor of 0 is 0 too (LoRA A at init has a zero gradient)."""
    p = torch.nn.Parameter(torch.ones(3, 5))
    optimizer = ExactMuon([p], lr=0.1, momentum_form="sum", ortho="svd")
    p.grad = torch.zeros(3, 5)
    optimizer.step()
    assert torch.equal(p.detach(), torch.ones(3, 5))


def test_muon_adamw_routes_matrices_to_the_exact_form_and_keeps_theta():
    weight, bias = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.zeros(4))
    optimizer = MuonAdamW([("w", weight), ("b", bias)], lr=1e-3, momentum_form="sum", ortho="svd", nesterov=False)
    assert isinstance(optimizer.muon, ExactMuon)
    optimizer.import_theta({"momentum_buffer:w": torch.ones(4, 3)})
    weight.grad, bias.grad = torch.randn(4, 3), torch.randn(4)
    optimizer.step()
    torch.testing.assert_close(optimizer.export_theta()["momentum_buffer:w"], 0.95 * torch.ones(4, 3) + weight.grad)
    assert isinstance(MuonAdamW([("w", weight)]).muon, torch.optim.Muon)  # the default stays torch's


@pytest.mark.parametrize("kwargs", [{"momentum_form": "nesterov"}, {"ortho": "qr"}])
def test_unknown_forms_are_refused(kwargs):
    with pytest.raises(ValueError, match="momentum_form|ortho"):
        MuonAdamW([("w", torch.nn.Parameter(torch.zeros(2, 2)))], **kwargs)
