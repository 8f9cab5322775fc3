"""SOAP's order options (paper vs code orders): when the factors absorb G (``factor_update``) and how a refresh orders
the eigenbasis (``eigenbasis_refresh``), each against a hand-written float64 trajectory of a 3 x 2 matrix."""

from __future__ import annotations

import math

import pytest
import torch

from fedhf.optim.soap import SOAP

B1 = B2 = 0.95
LR, EPS, F = 0.1, 1e-8, 2  # a refresh every 2 updates


def _grads(n=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 2, generator=g, dtype=torch.float64) for _ in range(n)]


def _refresh(factor, basis, V, dim, sort):
    if sort:  # Rayleigh quotients descending, V permuted alongside
        order = torch.argsort(torch.diagonal(basis.T @ factor @ basis), descending=True)
        basis, V = basis[:, order], V.index_select(dim, order)
    return torch.linalg.qr(factor @ basis)[0], V


def _by_hand(grads, factor_update, sort):
    """SOAP on one matrix (docs/algorithms.md 1.4), no weight decay: step 1 builds L, R and Q = eigh (descending), moves
    nothing; then Adam in the eigenbasis with the factors updated after (reference) or before (Shampoo) the step."""
    x = torch.zeros(3, 2, dtype=torch.float64)
    L, R = torch.zeros(3, 3, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64)
    m, V = torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, 2, dtype=torch.float64)

    def absorb(G):
        return B2 * L + (1 - B2) * G @ G.T, B2 * R + (1 - B2) * G.T @ G

    def refresh(t, QL, QR, m, V):
        if t % F:
            return QL, QR, m, V
        m_orig = QL @ m @ QR.T
        QL, V = _refresh(L, QL, V, 0, sort)
        QR, V = _refresh(R, QR, V, 1, sort)
        return QL, QR, QL.T @ m_orig @ QR, V

    L, R = absorb(grads[0])
    QL, QR = torch.linalg.eigh(L)[1].flip(1), torch.linalg.eigh(R)[1].flip(1)
    for t, G in enumerate(grads[1:], start=1):
        if factor_update == "before":
            L, R = absorb(G)
            QL, QR, m, V = refresh(t, QL, QR, m, V)
        Gr = QL.T @ G @ QR
        m, V = B1 * m + (1 - B1) * Gr, B2 * V + (1 - B2) * Gr ** 2
        x = x - LR * math.sqrt(1 - B2 ** t) / (1 - B1 ** t) * (QL @ (m / (V.sqrt() + EPS)) @ QR.T)
        if factor_update == "after":
            L, R = absorb(G)
            QL, QR, m, V = refresh(t, QL, QR, m, V)
    return x


def _soap(grads, **options):
    p = torch.nn.Parameter(torch.zeros(3, 2, dtype=torch.float64))
    optimizer = SOAP([("p", p)], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=0.0, precondition_frequency=F,
                     **options)
    for g in grads:
        p.grad = g.clone()
        optimizer.step()
    return p.detach()


@pytest.mark.parametrize("factor_update", ["after", "before"])
@pytest.mark.parametrize("refresh", ["sorted", "power_qr"])
def test_each_order_is_the_hand_written_soap(factor_update, refresh):
    grads = _grads()
    got = _soap(grads, factor_update=factor_update, eigenbasis_refresh=refresh)
    expected = _by_hand(grads, factor_update, refresh == "sorted")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)  # SOAP keeps G and its factors in float32


def test_the_options_change_the_trajectory_and_the_default_is_the_reference_order():
    grads = _grads()
    default = _soap(grads)
    assert torch.equal(default, _soap(grads, factor_update="after", eigenbasis_refresh="sorted"))
    for options in ({"factor_update": "before"}, {"eigenbasis_refresh": "power_qr"}):
        assert (default - _soap(grads, **options)).abs().max() > 1e-3, options


def test_unknown_orders_are_refused():
    with pytest.raises(ValueError, match="factor_update"):
        SOAP([torch.nn.Parameter(torch.zeros(2, 2))], factor_update="during")
    with pytest.raises(ValueError, match="eigenbasis_refresh"):
        SOAP([torch.nn.Parameter(torch.zeros(2, 2))], eigenbasis_refresh="eigh")
