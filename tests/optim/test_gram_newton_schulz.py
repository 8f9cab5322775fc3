"""Gram Newton-Schulz (a cheaper Muon option): the usual quintic iteration rewritten on X X^T, the same math."""

import pytest
import torch

from fedhf.optim.gram_newton_schulz import gram_newton_schulz, newton_schulz, orthogonalise


def _normalised(*shape, dtype=torch.float32, seed=0):
    x = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=(1, 2), keepdim=True)


@pytest.mark.parametrize("shape", [(3, 8, 384), (2, 16, 512), (2, 24, 48)])
def test_gram_form_is_the_usual_iteration_in_exact_arithmetic(shape):
    """In float64 the two forms agree to 1e-13 (pure rounding): Q_5 X_0 is X_5."""
    x = _normalised(*shape, dtype=torch.float64)
    assert (gram_newton_schulz(x) - newton_schulz(x)).abs().max() < 1e-13


def test_gram_form_in_float32_stays_at_float32_rounding():
    """In float32 the difference is float32 rounding of the entries (<= 1e-5 of the largest), and the float32 Gram
    form is as close to the float64 iteration as the float32 usual one is (within 2x)."""
    x = _normalised(3, 8, 384)
    exact = newton_schulz(x.double())
    gram, usual = gram_newton_schulz(x), newton_schulz(x)
    assert (gram - usual).abs().max() <= 1e-5 * usual.abs().max()
    assert (gram.double() - exact).norm() <= 2 * (usual.double() - exact).norm() + 1e-7


def test_steps_counts_are_honoured():
    """Each step is one application of P_k: one step by hand, X_1 = (a I + b A + c A^2) X_0; zero steps is X_0."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = _normalised(1, 4, 16, dtype=torch.float64)
    gram = x[0] @ x[0].T
    by_hand = (a * torch.eye(4, dtype=torch.float64) + b * gram + c * gram @ gram) @ x[0]
    assert torch.allclose(gram_newton_schulz(x, steps=1)[0], by_hand, atol=1e-14)
    assert torch.equal(gram_newton_schulz(x, steps=0), x)


def test_orthogonalise_uses_the_gram_form_only_where_it_saves_work():
    """m >= 2 n: the Gram form; near-square: the usual iteration, bit for bit."""
    wide, square = _normalised(2, 8, 64), _normalised(2, 16, 24)
    assert torch.equal(orthogonalise(wide), gram_newton_schulz(wide))
    assert torch.equal(orthogonalise(square), newton_schulz(square))
