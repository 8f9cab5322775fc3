"""Sophia: the GNB estimator against its exact expectation, the clipped update by hand, the Hutchinson and
empirical-Fisher estimates on problems with known curvature, the refresh schedule, and the conformance checks."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from fedhf.optim.base import ModelAccess
from fedhf.optim.sophia import (Sophia, gnb_estimate, hutchinson_estimate, labelled_rows, sophia_update,
    sophia_update_foreach)


def _access(model, forward=None):
    forward = forward or (lambda batch: model(batch["x"]))
    return ModelAccess(model=model, loss=lambda batch: F.cross_entropy(forward(batch), batch["labels"]),
                       logits=forward, batches=lambda: iter([]))


def _linear_softmax(seed=0):
    """logits = W x over two labelled examples and one padding row (label -100), 3 classes, float64."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(3, 4, generator=g, dtype=torch.float64))
    x = torch.randn(3, 4, generator=g, dtype=torch.float64)
    labels = torch.tensor([2, -100, 0])
    return weight, x, labels


def _exact_gnb_moments(weight, x):
    """E[h_hat] and E[h_hat^2] over y_hat ~ softmax(W x), by enumerating all 3^B label combinations."""
    probs = torch.softmax(x @ weight.detach().T, dim=-1)
    first, second = torch.zeros_like(weight), torch.zeros_like(weight)
    for combo in itertools.product(range(3), repeat=x.shape[0]):
        chance = torch.prod(probs[torch.arange(x.shape[0]), list(combo)])
        (h_hat,) = gnb_estimate(x @ weight.T, torch.tensor(combo), [weight])
        first += chance * h_hat
        second += chance * h_hat * h_hat
    return first, second


def test_gnb_expectation_times_batch_is_the_gauss_newton_diagonal():
    weight, x, labels = _linear_softmax()
    kept = x[labels != -100]
    first, _ = _exact_gnb_moments(weight, kept)
    # Gauss-Newton of the mean CE: (1/B) sum_i (diag(p_i) - p_i p_i^T) (x) x_i x_i^T; its diagonal for W[c, d] is
    # (1/B) sum_i p_ic (1 - p_ic) x_id^2. The sampled-label gradients of different examples have zero mean, so the
    # cross terms vanish and B E[g_hat^2] equals it (Sophia paper, sec. 2.3).
    probs = torch.softmax(kept @ weight.detach().T, dim=-1)
    gauss_newton_diagonal = (probs * (1 - probs)).T @ (kept * kept) / kept.shape[0]
    torch.testing.assert_close(kept.shape[0] * first, gauss_newton_diagonal, rtol=1e-12, atol=0)


def test_gnb_refresh_matches_the_exact_expectation_on_average():
    weight, x, labels = _linear_softmax()
    optimizer = Sophia([("w", weight)], betas=(0.965, 0.0))  # b2 = 0: h is the last single-draw estimate
    optimizer.attach(_access(torch.nn.Module(), lambda batch: batch["x"] @ weight.T))
    batch = {"x": x, "labels": labels}
    torch.manual_seed(0)
    draws = 3000
    total = torch.zeros_like(weight)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only adds synchronisation on a busy machine
    try:
        for _ in range(draws):
            optimizer.before_forward(0, batch)
            total += optimizer.state[weight]["hessian"].double()
    finally:
        torch.set_num_threads(threads)
    assert optimizer.param_groups[0]["hessian_batch_size"] == 2  # the padding row is not counted
    first, second = _exact_gnb_moments(weight, x[labels != -100])
    standard_error = ((second - first * first) / draws).sqrt()
    # 4 standard errors per coordinate (12 coordinates; the seed is fixed, so the check is deterministic).
    assert torch.all((total / draws - first).abs() <= 4 * standard_error + 1e-9), (total / draws, first)


def test_labelled_rows_drops_padding_and_shifts_for_causal_lms():
    logits = torch.arange(8.0).reshape(1, 4, 2)  # row t has logits (2t, 2t+1)
    labels = torch.tensor([[-100, 1, -100, 0]])
    assert labelled_rows(logits, labels, shift=False)[:, 0].tolist() == [2.0, 6.0]  # token classification
    assert labelled_rows(logits, labels, shift=True)[:, 0].tolist() == [0.0, 4.0]  # position t predicts label t+1
    assert labelled_rows(logits, None, shift=True).shape == (4, 2)


def test_gnb_on_a_causal_lm_counts_the_shifted_tokens():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    labels = torch.tensor([[-100, 3, 4, -100, 5], [1, 2, 3, 4, -100]])  # shifted: 3 + 3 labelled tokens
    batch = {"input_ids": labels.clamp(min=0), "labels": labels}
    optimizer = Sophia(list(model.named_parameters()))  # shift_labels detected from GPT2LMHeadModel
    optimizer.attach(_access(model, lambda b: model(input_ids=b["input_ids"]).logits))
    optimizer.before_forward(0, batch)
    assert optimizer.shift_labels is True and optimizer.param_groups[0]["hessian_batch_size"] == 6
    assert optimizer.state[model.lm_head.weight]["hessian"].sum() > 0
    assert all(p.grad is None for p in model.parameters())


def test_update_is_the_hand_formula_with_clipping_and_decoupled_weight_decay():
    lr, beta1, rho, wd, bs = 0.1, 0.5, 0.04, 0.1, 8
    param = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    grad = torch.tensor([0.4, -0.2, 0.02, 0.8], dtype=torch.float64)
    exp_avg = torch.tensor([0.2, 0.2, -0.02, 0.0], dtype=torch.float64)
    hessian = torch.tensor([0.5, 0.0, 0.25, 10.0], dtype=torch.float64)
    m = [0.5 * 0.2 + 0.5 * 0.4, 0.5 * 0.2 - 0.5 * 0.2, -0.5 * 0.02 + 0.5 * 0.02, 0.5 * 0.8]  # [0.3, 0, 0, 0.4]
    # ratio = |m| / (rho bs h + 1e-15): 0.3/0.16 -> clipped to 1; 0 -> 0; 0 -> 0; 0.4/3.2 = 0.125 (not clipped)
    expected = [1.0 * 0.99 - lr * 1.0, -2.0 * 0.99, 3.0 * 0.99, 0.5 * 0.99 - lr * 0.125]
    sophia_update(param, grad, exp_avg, hessian, lr=lr, beta1=beta1, rho=rho, weight_decay=wd, batch_size=bs)
    torch.testing.assert_close(exp_avg, torch.tensor(m, dtype=torch.float64), rtol=1e-15, atol=1e-17)
    torch.testing.assert_close(param, torch.tensor(expected, dtype=torch.float64), rtol=1e-15, atol=1e-17)


def test_zero_hessian_gives_sign_momentum():
    param = torch.nn.Parameter(torch.zeros(6))
    optimizer = Sophia([param], lr=0.01, betas=(0.9, 0.99), weight_decay=0.0)
    grads = [torch.tensor([1e-6, -3.0, 0.5, -1e-4, 2.0, 0.0]), torch.tensor([-2e-6, 1.0, 0.5, 1e-4, -30.0, 0.0])]
    expected, m = torch.zeros(6), torch.zeros(6)
    for g in grads:
        param.grad = g
        optimizer.step()
        m = 0.9 * m + 0.1 * g
        expected -= 0.01 * torch.sign(m)
    torch.testing.assert_close(param.detach(), expected, rtol=0, atol=1e-9)


def _quadratic(diagonal):
    point = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64))
    loss = lambda batch: 0.5 * (diagonal * point * point).sum()  # Hessian diag(diagonal)
    return point, ModelAccess(model=torch.nn.Module(), loss=loss, logits=None, batches=lambda: iter([]))


def test_hutchinson_is_exact_for_a_diagonal_hessian_and_clamped_at_zero():
    diagonal = torch.tensor([2.0, 0.5, -1.0, 4.0], dtype=torch.float64)
    point, access = _quadratic(diagonal)
    torch.manual_seed(0)
    for _ in range(3):  # u * (H u) = u^2 diag(H) = diag(H) for every Rademacher u
        (estimate,) = hutchinson_estimate(access.loss({}), [point])
        torch.testing.assert_close(estimate, diagonal, rtol=0, atol=0)
    optimizer = Sophia([point], betas=(0.965, 0.0), hessian_estimator="hutchinson")
    optimizer.attach(access)
    optimizer.before_forward(0, {"labels": torch.zeros(7)})
    torch.testing.assert_close(optimizer.state[point]["hessian"], diagonal.clamp(min=0).float(), rtol=0, atol=0)
    assert optimizer.param_groups[0]["hessian_batch_size"] == 1
    assert point.grad is None


def test_hutchinson_names_the_fix_when_the_double_backward_fails():
    point = torch.nn.Parameter(torch.randn(3, 2))
    loss = torch.cdist(point, torch.randn(4, 2)).sum()  # like SDPA's fused kernels: no double backward
    with pytest.raises(RuntimeError, match="attn_implementation=\"eager\""):
        hutchinson_estimate(loss, [point])


def test_empirical_fisher_is_the_squared_true_label_gradient():
    weight, x, labels = _linear_softmax()
    optimizer = Sophia([("w", weight)], betas=(0.965, 0.0), hessian_estimator="empirical_fisher")
    optimizer.attach(_access(torch.nn.Module(), lambda batch: batch["x"] @ weight.T))
    optimizer.before_forward(0, {"x": x, "labels": labels})
    (gradient,) = torch.autograd.grad(F.cross_entropy(x @ weight.T, labels), [weight])
    torch.testing.assert_close(optimizer.state[weight]["hessian"], (gradient * gradient).float(), rtol=0, atol=0)
    assert optimizer.param_groups[0]["hessian_batch_size"] == 2


def _toy(seed=0):
    """The shared conformance problem: labels from a fixed linear teacher."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    x = torch.randn(128, 8)
    y = (x @ torch.randn(8, 3)).argmax(1)
    return model, {"x": x, "labels": y}


def _build(model, **kwargs):
    optimizer = Sophia(list(model.named_parameters()), **kwargs)
    optimizer.attach(_access(model))
    return optimizer


def _steps(model, optimizer, batch, first_step, n):
    """A trainer's local steps: the hook (with .grad empty), then forward, backward, step."""
    losses = []
    for step in range(first_step, first_step + n):
        optimizer.zero_grad(set_to_none=True)
        optimizer.before_forward(step, batch)
        loss = F.cross_entropy(model(batch["x"]), batch["labels"])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("estimator", ["gnb", "hutchinson", "empirical_fisher"])
def test_refresh_runs_at_steps_0_k_2k_and_leaves_grad_untouched(estimator):
    model, batch = _toy()
    optimizer = _build(model, hessian_estimator=estimator, hess_interval=3)
    refreshed, current = [], [0]
    access = optimizer.model_access
    optimizer.attach(ModelAccess(model, loss=lambda b: refreshed.append(current[0]) or access.loss(b),
                                 logits=lambda b: refreshed.append(current[0]) or access.logits(b),
                                 batches=access.batches))
    for step in range(8):
        current[0] = step
        optimizer.zero_grad(set_to_none=True)
        optimizer.before_forward(step, batch)
        assert all(p.grad is None for p in model.parameters())
        F.cross_entropy(model(batch["x"]), batch["labels"]).backward()
        optimizer.step()
    assert refreshed == [0, 3, 6]
    preset = [torch.randn_like(p) for p in model.parameters()]  # a .grad already there is left exactly as it was
    for p, g in zip(model.parameters(), preset):
        p.grad = g.clone()
    current[0] = 9
    optimizer.before_forward(9, batch)
    assert refreshed == [0, 3, 6, 9]
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), preset))


def test_foreach_update_is_the_per_tensor_update_bit_for_bit():
    """sophia_update_foreach (one kernel per op for all tensors, for speed) = sophia_update tensor by tensor, and
    Sophia steps float32 parameters with it and a bfloat16 one with the per-tensor path."""
    torch.manual_seed(0)
    shapes = [(4, 24), (24, 4), (7,), (3, 5, 2)]
    settings = dict(lr=3e-2, beta1=0.9, rho=0.04, weight_decay=0.1, batch_size=8.0)
    params = [torch.randn(s) for s in shapes]
    grads, exp_avgs = [torch.randn(s) for s in shapes], [torch.randn(s) * 0.1 for s in shapes]
    hessians = [torch.rand(s) * 1e-2 for s in shapes]
    hessians[0][0, :3] = 0.0  # h = 0: the clip at 1 must act
    copies = [[t.clone() for t in ts] for ts in (params, exp_avgs)]
    for p, g, m, h in zip(*copies[:1], grads, copies[1], hessians):
        sophia_update(p, g, m, h, **settings)
    sophia_update_foreach(params, grads, exp_avgs, hessians, **settings)
    for mine, theirs in zip(params + exp_avgs, copies[0] + copies[1]):
        assert torch.equal(mine, theirs)
    half = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.bfloat16))
    optimizer = Sophia([("w", half)], lr=1e-2)
    half.grad = torch.randn(4, 4, dtype=torch.bfloat16)
    before = half.detach().clone()
    optimizer.step()
    assert half.dtype == torch.bfloat16 and not torch.equal(half.detach(), before)


def test_inverse_cdf_labels_are_the_softmax_quantiles_and_follow_its_distribution():
    """sample_labels(..., "inverse_cdf") (the default): y is the first class whose cumulative probability reaches
    the row's uniform draw, so over 20,000 rows each class turns up with its softmax probability (4 sigma)."""
    from fedhf.optim.sophia import sample_labels

    logits = torch.tensor([[2.0, 0.0, -1.0, 1.0, -30.0]]).repeat(20000, 1)
    torch.manual_seed(3)
    u = torch.rand(20000, 1)
    torch.manual_seed(3)
    labels = sample_labels(logits, "inverse_cdf")
    cdf = torch.softmax(logits, -1).cumsum(-1)
    below = torch.cat([torch.zeros(20000, 1), cdf], 1).gather(1, labels[:, None]).squeeze(1)
    above = cdf.gather(1, labels[:, None]).squeeze(1)
    scaled = u.squeeze(1) * cdf[:, -1]
    assert bool(((below < scaled) & (scaled <= above)).all())
    p = torch.softmax(logits[0], -1)
    freq = torch.bincount(labels, minlength=5).double() / 20000
    assert bool(((freq - p.double()).abs() <= 4 * (p * (1 - p) / 20000).sqrt().double() + 1e-12).all())
    assert freq[4] == 0  # p = 9e-15: never drawn


def test_sophia_label_sampler_option():
    model = torch.nn.Linear(3, 4)
    optimizer = Sophia(list(model.named_parameters()), label_sampler="inverse_cdf")
    optimizer.attach(_access(model))
    optimizer.refresh_hessian({"x": torch.randn(6, 3), "labels": torch.randint(0, 4, (6,))})
    assert all(float(optimizer.state[p]["hessian"].abs().sum()) > 0 for p in model.parameters())
    with pytest.raises(ValueError, match="label_sampler"):
        Sophia(list(model.named_parameters()), label_sampler="gumbel")


def test_direction_is_the_signed_clip_bit_for_bit():
    """sophia_direction's clamp(m / d, -1, 1) = sign(m) min(|m| / d, 1) exactly (d = rho bs h + eps), with zeros,
    clipped and unclipped coordinates and h = 0."""
    from fedhf.optim.sophia import sophia_direction

    torch.manual_seed(0)
    m = torch.randn(500) * 1e-3
    m[:5] = 0.0
    h = torch.rand(500) * 1e-2
    h[5:20] = 0.0
    d = h * (0.04 * 8.0) + 1e-15
    expected = m.sign() * torch.minimum(m.abs() / d, torch.ones(()))
    got = sophia_direction(m, h, 0.04, 8.0)
    assert torch.equal(got, expected)
    assert bool((got.abs() == 1).any()) and bool(((got.abs() < 1) & (got != 0)).any())


@pytest.mark.parametrize("estimator", ["gnb", "empirical_fisher", "hutchinson"])
def test_the_logits_pass_it_declares_is_the_one_it_runs(estimator):
    """The memory plan counts every position's logits for the optimizers that declare ``logits_pass``: Sophia
    declares it exactly for the estimator that calls ``ModelAccess.logits``."""
    weight, x, labels = _linear_softmax()
    calls = []
    access = _access(torch.nn.Module())
    access.logits = lambda batch: calls.append("logits") or batch["x"] @ weight.T
    access.loss = lambda batch: F.cross_entropy(batch["x"] @ weight.T, batch["labels"])
    optimizer = Sophia([("w", weight)], hessian_estimator=estimator, shift_labels=False)
    optimizer.attach(access)
    optimizer.refresh_hessian({"x": x, "labels": labels})
    assert Sophia.logits_pass(hessian_estimator=estimator) == ("backward" if calls else None)
    assert (Sophia.unplanned_memory(hessian_estimator=estimator) is None) == (estimator != "hutchinson")
