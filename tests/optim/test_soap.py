"""SOAP: Adam in Shampoo's eigenbasis (docs/algorithms.md 1.4), its first step, its factors as Theta (2.9b)."""

from __future__ import annotations


import pytest
import torch

from fedhf.optim.soap import SOAP, project, project_back, refresh_eigenbases, soap_direction

BETAS = (0.95, 0.95)


def _gradients(shape, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


def _randn(*shape, seed=100):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _adamw_trajectory(start, grads, lr, weight_decay=0.0, eps=1e-8):
    p = torch.nn.Parameter(start.clone())
    adamw = torch.optim.AdamW([p], lr=lr, betas=BETAS, eps=eps, weight_decay=weight_decay, foreach=False)
    out = []
    for g in grads:
        p.grad = g.clone()
        adamw.step()
        out.append(p.detach().clone())
    return out


def _soap_trajectory(start, grads, **kwargs):
    p = torch.nn.Parameter(start.clone())
    soap = SOAP([("p", p)], **kwargs)
    out = []
    for g in grads:
        p.grad = g.clone()
        soap.step()
        out.append(p.detach().clone())
    return out, soap, p


def test_soap_direction_with_identity_basis_is_adam():
    start, grads = _randn(5, 4), _gradients((5, 4), 6)
    identity = [torch.eye(5), torch.eye(4)]
    exp_avg, exp_avg_sq, p, ours = torch.zeros(5, 4), torch.zeros(5, 4), start.clone(), []
    for t, g in enumerate(grads, start=1):
        p = p - 0.1 * soap_direction(g, identity, exp_avg, exp_avg_sq, t, BETAS, 1e-8)
        ours.append(p)
    # Updates of ~0.5; eps placement (inside vs after the bias correction) changes them by ~1e-8.
    for a, b in zip(ours, _adamw_trajectory(start, grads, lr=0.1)):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape, kwargs", [((7,), {}),  # 1-D: never a factor
                                           ((5, 4), {"max_precond_dim": 0})])  # every dim too large
def test_tensors_without_factors_get_adamw_after_their_first_step(shape, kwargs):
    start, grads = _randn(*shape), _gradients(shape, 6, seed=1)
    ours, soap, _ = _soap_trajectory(start, grads, lr=0.1, weight_decay=0.0, **kwargs)
    assert torch.equal(ours[0], start)  # the first step only initialises, even without factors (reference)
    assert not any(k.startswith(("GG", "Q")) for k in soap.state[soap.param_groups[0]["params"][0]])
    for a, b in zip(ours[1:], _adamw_trajectory(start, grads[1:], lr=0.1)):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)


def test_weight_decay_is_decoupled_and_applied_after_the_update():
    lr, wd, eps = 0.1, 0.5, 1e-8
    start, (g1, g2, g3) = _randn(6), _gradients((6,), 3, seed=2)
    ours, _, _ = _soap_trajectory(start, [g1, g2, g3], lr=lr, weight_decay=wd, eps=eps)
    (b1, b2), p = BETAS, start.clone()
    m, v = torch.zeros(6), torch.zeros(6)
    for t, g in enumerate([g2, g3], start=1):  # g1 only initialised the state
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = p - lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t) * m / (v.sqrt() + eps)
        p = p * (1 - lr * wd)  # after the update, unlike torch.optim.AdamW
    assert torch.allclose(ours[-1], p, rtol=0, atol=1e-6)


def test_first_step_builds_a_sorted_eigenbasis_and_moves_nothing():
    start, (grad,) = _randn(6, 4), _gradients((6, 4), 1, seed=3)
    ours, soap, p = _soap_trajectory(start, [grad])
    state = soap.state[p]
    assert torch.equal(ours[0], start) and state["step"] == 0
    assert torch.allclose(state["GG0"], 0.05 * grad @ grad.T, atol=1e-6)  # lerp from zeros with 1 - b2
    assert torch.allclose(state["GG1"], 0.05 * grad.T @ grad, atol=1e-6)
    for d in (0, 1):
        q, factor = state[f"Q{d}"], state[f"GG{d}"]
        diagonal = q.T @ factor @ q
        eigen = torch.diag(diagonal)
        assert torch.allclose(q.T @ q, torch.eye(len(q)), atol=1e-5)
        assert torch.allclose(diagonal, torch.diag(eigen), atol=1e-5 * eigen.max())
        assert torch.all(eigen[:-1] >= eigen[1:])


def test_factors_only_for_dims_within_max_precond_dim():
    wide, conv, bias = (torch.nn.Parameter(torch.zeros(s)) for s in [(5, 20), (4, 3, 2, 2), (6,)])
    soap = SOAP([("wide", wide), ("conv", conv), ("bias", bias)], max_precond_dim=10)
    for seed, p in enumerate((wide, conv, bias)):
        p.grad = _randn(*p.shape, seed=seed)
    soap.step()
    keys = {name: sorted(k for k in soap.state[p] if k.startswith(("GG", "Q")))
            for name, p in [("wide", wide), ("conv", conv), ("bias", bias)]}
    assert keys == {"wide": ["GG0", "Q0"], "conv": ["GG0", "GG1", "GG2", "GG3", "Q0", "Q1", "Q2", "Q3"], "bias": []}
    assert [soap.state[conv][f"GG{d}"].shape for d in range(4)] == [(4, 4), (3, 3), (2, 2), (2, 2)]
    assert sorted(soap.export_theta()) == ["GG0:conv", "GG0:wide", "GG1:conv", "GG2:conv", "GG3:conv"]
    one_d = torch.nn.Parameter(torch.zeros(6))
    soap_1d = SOAP([one_d], precondition_1d=True)
    one_d.grad = _randn(6)
    soap_1d.step()
    assert torch.allclose(soap_1d.state[one_d]["GG0"], 0.05 * torch.outer(one_d.grad, one_d.grad), atol=1e-6)


def test_projection_is_a_rotation_along_each_dim():
    x = _randn(3, 4, 5)
    a, c = torch.linalg.qr(_randn(3, 3, seed=1))[0], torch.linalg.qr(_randn(5, 5, seed=2))[0]
    assert torch.allclose(project(x, [a, None, c]), torch.einsum("ijk,ia,kc->ajc", x, a, c), atol=1e-6)
    assert torch.allclose(project_back(project(x, [a, None, c]), [a, None, c]), x, atol=1e-6)
    m = _randn(3, 5, seed=3)
    assert torch.allclose(project(m, [a, c]), a.T @ m @ c, atol=1e-6)


def test_refresh_sorts_the_basis_and_permutes_the_second_moment():
    factor = torch.diag(torch.tensor([1.0, 3.0, 2.0]))
    v = torch.arange(6.0).reshape(3, 2)
    bases, permuted = refresh_eigenbases([factor, None], [torch.eye(3), None], v)
    assert bases[1] is None
    assert torch.allclose(bases[0].abs(), torch.eye(3)[:, [1, 2, 0]])  # QR may flip signs
    assert torch.equal(permuted, v[[1, 2, 0]])


def _literal_soap_2d(start, grads, lr, wd, f, eps=1e-8, b1=0.95, b2=0.95):
    """docs/algorithms.md 1.4 written with matrices, rotating m back and forth after every step like the reference."""
    p, (L, R), t = start.clone(), (torch.zeros(len(start), len(start)), torch.zeros(start.shape[1], start.shape[1])), 0
    L, R = L.lerp(grads[0] @ grads[0].T, 1 - b2), R.lerp(grads[0].T @ grads[0], 1 - b2)
    ql, qr = torch.linalg.eigh(L)[1].flip(1), torch.linalg.eigh(R)[1].flip(1)
    m, v, out = torch.zeros_like(p), torch.zeros_like(p), [p.clone()]
    for g in grads[1:]:
        rotated, t = ql.T @ g @ qr, t + 1
        m, v = b1 * m + (1 - b1) * rotated, b2 * v + (1 - b2) * rotated ** 2
        p = p - lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t) * (ql @ (m / (v.sqrt() + eps)) @ qr.T)
        p = p * (1 - lr * wd)
        m = ql @ m @ qr.T
        L, R = b2 * L + (1 - b2) * g @ g.T, b2 * R + (1 - b2) * g.T @ g
        if t % f == 0:
            order = torch.argsort(torch.diag(ql.T @ L @ ql), descending=True)
            v, ql = v[order], torch.linalg.qr(L @ ql[:, order])[0]
            order = torch.argsort(torch.diag(qr.T @ R @ qr), descending=True)
            v, qr = v[:, order], torch.linalg.qr(R @ qr[:, order])[0]
        m = ql.T @ m @ qr
        out.append(p.clone())
    return out


def test_matches_the_literal_two_sided_algorithm_across_refreshes():
    start, grads = _randn(6, 4), _gradients((6, 4), 26, seed=4)  # 25 updates: refreshes at t = 10, 20
    ours, _, _ = _soap_trajectory(start, grads, lr=0.1, weight_decay=0.01, precondition_frequency=10)
    for a, b in zip(ours, _literal_soap_2d(start, grads, lr=0.1, wd=0.01, f=10)):
        assert torch.allclose(a, b, rtol=0, atol=1e-5)  # float32 rounding of two evaluation orders


def test_imported_theta_is_lerped_with_the_first_gradient_and_moves_nothing():
    start, (grad,) = _randn(6, 4), _gradients((6, 4), 1, seed=5)
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(6, 6, generator=g), torch.randn(4, 4, generator=g)
    left, right = a @ a.T, b @ b.T
    p = torch.nn.Parameter(start.clone())
    soap = SOAP([("w", p)], shampoo_beta=0.9)
    soap.import_theta({"GG0:w": left, "GG1:w": right})
    p.grad = grad
    soap.step()
    assert torch.equal(p.detach(), start)
    assert torch.allclose(soap.state[p]["GG0"], 0.9 * left + 0.1 * grad @ grad.T, atol=1e-5)
    assert torch.allclose(soap.state[p]["GG1"], 0.9 * right + 0.1 * grad.T @ grad, atol=1e-5)
    q = soap.state[p]["Q0"]
    diagonal = q.T @ soap.state[p]["GG0"] @ q
    assert torch.allclose(diagonal, torch.diag(torch.diag(diagonal)), atol=1e-4)
    # Importing into a stepped optimizer restarts that tensor: the next step moves nothing again.
    soap.import_theta(soap.export_theta())
    p.grad = grad
    soap.step()
    assert torch.equal(p.detach(), start) and soap.state[p]["step"] == 0
    with pytest.raises(KeyError):
        soap.import_theta({"GG2:w": left})
