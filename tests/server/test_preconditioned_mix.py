"""FedPM's preconditioned mixing: one global Newton step on a quadratic, consensus, the FedAvg limit, the client half."""

from __future__ import annotations

import pytest
import torch

from fedhf.core.sums import RoundSums
from fedhf.core.context import ClientContext, ServerContext
from fedhf.optim.base import ModelAccess
from fedhf.optim.foof import FOOF, damped_cholesky, foof_direction
from fedhf.optim import LocalOptimizer
from fedhf.core.params import num_bytes, snapshot
from fedhf.server import ServerRule, Step
from fedhf.server.preconditioned_mix import PreconditionedMix, preconditioned_mix

WEIGHTS = [1.0, 2.0, 3.0]


def _mix(aggregator, x, mean_delta, sums):
    """The named ``preconditioned_mix`` rule: the aggregator, then the plain step (eta_g = 1)."""
    ctx = ServerContext(round=0, round_lr=1.0, local_steps=1, num_clients=3, sums=sums, global_params=x,
                        mean_delta=mean_delta)
    return ServerRule(aggregator, [Step()]).apply(x, {}, ctx)


def _client_data(seed=0, d_in=4, d_out=2):
    """Three least-squares clients with different input distributions and targets (non-IID)."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for i, n in enumerate((9, 12, 15)):
        a = torch.randn(n, d_in, generator=g, dtype=torch.float64) * (1 + i) + i
        y = a @ torch.randn(d_in, d_out, generator=g, dtype=torch.float64) + torch.randn(n, d_out, generator=g,
                                                                                        dtype=torch.float64)
        data.append((a, y))
    return data


def _with_one(a):
    return torch.cat([a, torch.ones(a.shape[0], 1, dtype=a.dtype)], 1)


def _stats(a, y):
    """f_i(W) = 0.5 mean ||W a - y||^2: gradient W A_i - C_i, Hessian W -> W A_i."""
    a = _with_one(a)
    return a.T @ a / a.shape[0], y.T @ a / a.shape[0]


def _spd(n, seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, n, generator=g, dtype=torch.float64)
    return m @ m.T / n + 0.1 * torch.eye(n, dtype=torch.float64)


def test_one_foof_step_per_client_then_mixing_is_one_global_newton_step_pure_functions():
    data = _client_data()
    W0 = torch.randn(2, 5, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    stats = [_stats(a, y) for a, y in data]
    PD_sum = P_sum = 0
    for w, (A, C) in zip(WEIGHTS, stats):
        delta = -foof_direction(W0 @ A - C, damped_cholesky(A, 0.0))  # lr 1, damping 0, K = 1
        PD_sum, P_sum = PD_sum + w * delta @ A, P_sum + w * A
    W1 = W0 + preconditioned_mix(PD_sum, P_sum)
    A_bar = sum(w * A for w, (A, _) in zip(WEIGHTS, stats)) / sum(WEIGHTS)
    C_bar = sum(w * C for w, (_, C) in zip(WEIGHTS, stats)) / sum(WEIGHTS)
    newton = W0 - (W0 @ A_bar - C_bar) @ torch.linalg.inv(A_bar)
    torch.testing.assert_close(W1, newton, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(W1, C_bar @ torch.linalg.inv(A_bar), rtol=1e-10, atol=1e-10)  # the minimiser
    torch.testing.assert_close(W1 @ A_bar - C_bar, torch.zeros_like(W1), rtol=0, atol=1e-10)  # zero gradient


def _one_foof_step(model, x0, batch, damping):
    """A client round of one full-batch FOOF step (lr 1) on 0.5 mean ||model(x) - y||^2, from x0; A refreshed."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(x0[n])
    optimizer = FOOF(params.items(), lr=1.0, damping=damping, weight_decay=0.0)
    optimizer.attach(ModelAccess(model=model, logits=lambda b: model(b["x"]), batches=lambda: iter([batch]),
                                 loss=lambda b: 0.5 * (model(b["x"]) - b["y"]).pow(2).sum(1).mean()))
    optimizer.before_forward(0, batch)
    optimizer.zero_grad()
    optimizer.model_access.loss(batch).backward()
    optimizer.step()
    optimizer.end_round()
    return optimizer


def test_foof_optimizer_and_server_rule_take_the_global_newton_step():
    data = _client_data(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).double()
    params = dict(model.named_parameters())
    x0 = {n: p.detach().clone() for n, p in params.items()}  # float64 here (the trainer keeps fp32)
    rule, sums, used_A = PreconditionedMix(), RoundSums(), []
    for w, (a, y) in zip(WEIGHTS, data):
        # one FOOF step from x0; the input covariance of a single linear layer does not depend on W
        optimizer = _one_foof_step(model, x0, {"x": a, "y": y}, damping=0.0)
        used_A.append(optimizer.export_theta()["A:weight"].double())
        ctx = ClientContext(client_id=0, round=0, round_lr=1.0, local_lr=1.0, local_steps=1, weight=w,
                            params=params, global_params=x0, correction_state={}, store=None)
        dx = {n: p.detach() - x0[n] for n, p in params.items()}
        sums.add_tensors("dx", dx, scale=w)
        sent = rule.client_end(ctx, optimizer)
        sums.add_message(sent)
        sums.add("w", w)
        assert num_bytes(dx) + sent.nbytes == (2 * 4 + 2) * 8 + 5 * 6 // 2 * 4  # dx (float64 here) + P's triangle
    mean_delta = {n: t / sums.scalar("w") for n, t in sums.tensors("dx", x0).items()}
    new_x, _ = _mix(rule, x0, mean_delta, sums)
    W1 = torch.cat([new_x["weight"], new_x["bias"][:, None]], 1)
    W0 = torch.cat([x0["weight"], x0["bias"][:, None]], 1)
    stats = [_stats(a, y) for a, y in data]
    G_bar = sum(w * (W0 @ A - C) for w, (A, C) in zip(WEIGHTS, stats)) / sum(WEIGHTS)
    A_used = sum(w * A for w, A in zip(WEIGHTS, used_A)) / sum(WEIGHTS)  # float32-stored A, as the clients used
    torch.testing.assert_close(W1, W0 - G_bar @ torch.linalg.inv(A_used), rtol=1e-10, atol=1e-10)
    A_bar = sum(w * A for w, (A, _) in zip(WEIGHTS, stats)) / sum(WEIGHTS)
    C_bar = sum(w * C for w, (_, C) in zip(WEIGHTS, stats)) / sum(WEIGHTS)
    torch.testing.assert_close(W1, C_bar @ torch.linalg.inv(A_bar), rtol=1e-6, atol=1e-6)  # up to A in float32


def _sums_for(deltas, Ps, weights):
    sums = RoundSums()
    for d, P, w in zip(deltas, Ps, weights):
        sums.add("P.lin.weight", P, scale=w)
        sums.add("PD.lin.weight", d @ P, scale=w)
    return sums


def test_identical_client_updates_are_returned_whatever_the_preconditioners():
    delta = torch.randn(2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    Ps = [_spd(5, s) + 0.3 * torch.eye(5, dtype=torch.float64) for s in range(3)]
    sums = _sums_for([delta] * 3, Ps, WEIGHTS)
    x = {"lin.weight": torch.randn(2, 4, dtype=torch.float64), "lin.bias": torch.randn(2, dtype=torch.float64),
         "norm.weight": torch.ones(3, dtype=torch.float64)}
    mean_delta = {"lin.weight": torch.zeros(2, 4, dtype=torch.float64), "lin.bias": torch.zeros(2, dtype=torch.float64),
                  "norm.weight": torch.full((3,), 0.25, dtype=torch.float64)}
    new_x, state = _mix(PreconditionedMix(), x, mean_delta, sums)
    torch.testing.assert_close(new_x["lin.weight"], x["lin.weight"] + delta[:, :4], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new_x["lin.bias"], x["lin.bias"] + delta[:, 4], rtol=1e-12, atol=1e-12)
    assert torch.equal(new_x["norm.weight"], x["norm.weight"] + 0.25) and state == {}  # non-FOOF: plain mean


def test_large_damping_approaches_the_weighted_mean():
    g = torch.Generator().manual_seed(1)
    deltas = [torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in WEIGHTS]
    mean = sum(w * d for w, d in zip(WEIGHTS, deltas)) / sum(WEIGHTS)
    errors = []
    for damping in (1e2, 1e4, 1e6):
        Ps = [_spd(5, s) + damping * torch.eye(5, dtype=torch.float64) for s in range(3)]
        sums = _sums_for(deltas, Ps, WEIGHTS)
        errors.append((preconditioned_mix(sums.get("PD.lin.weight"), sums.get("P.lin.weight")) - mean).abs().max())
    assert errors[0] > 1e-4 and errors[1] < 2e-2 * errors[0] and errors[2] < 2e-2 * errors[1]  # O(1 / damping)
    assert errors[2] < 1e-5


def test_clear_error_for_a_non_foof_optimizer():
    model = torch.nn.Linear(3, 2)
    ctx = ClientContext(client_id=0, round=0, round_lr=0.1, local_lr=0.1, local_steps=1, weight=1.0,
                        params=dict(model.named_parameters()), global_params=snapshot(dict(model.named_parameters())),
                        correction_state={}, store=None)
    with pytest.raises(ValueError, match="local_optimizer"):
        PreconditionedMix().client_end(ctx, LocalOptimizer("sgd").build(dict(model.named_parameters()), 0.1))


class _HeadAndLoRA(torch.nn.Module):
    """A head and a tensor named like peft's LoRA A (``adapter.lora_A.default.weight``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(4, 2)
        self.adapter = torch.nn.ModuleDict({"lora_A": torch.nn.ModuleDict({"default": torch.nn.Linear(4, 2, bias=False)})})

    def forward(self, x):
        return self.head(x) + self.adapter["lora_A"]["default"](x)


@pytest.mark.parametrize("mix_lora", [False, True])
def test_lora_tensors_are_averaged_unless_mix_lora(mix_lora):
    """docs/algorithms.md 6: FedPM on LoRA mixes LoRA tensors by FedAvg unless enabled; the head is mixed either way."""
    lora = "adapter.lora_A.default.weight"
    model = _HeadAndLoRA().double()
    params = dict(model.named_parameters())
    x0 = {n: p.detach().clone() for n, p in params.items()}
    rule, sums = PreconditionedMix(mix_lora=mix_lora), RoundSums()
    for w, (a, y) in zip(WEIGHTS, _client_data(2)):
        optimizer = _one_foof_step(model, x0, {"x": a, "y": y}, damping=0.1)
        ctx = ClientContext(client_id=0, round=0, round_lr=1.0, local_lr=1.0, local_steps=1, weight=w,
                            params=params, global_params=x0, correction_state={}, store=None)
        sent = rule.client_end(ctx, optimizer)
        sums.add_message(sent)
        sums.add("w", w)
        sums.add_tensors("dx", {n: p.detach() - x0[n] for n, p in params.items()}, scale=w)
        assert sent.nbytes == (5 * 6 // 2 + (4 * 5 // 2 if mix_lora else 0)) * 4  # upper triangles of P
    assert ("P." + lora in sums.keys()) == mix_lora and "P.head.weight" in sums.keys()
    mean_delta = {n: t / sums.scalar("w") for n, t in sums.tensors("dx", x0).items()}
    new_x, _ = _mix(rule, x0, mean_delta, sums)
    mixed = preconditioned_mix(sums.get("PD.head.weight"), sums.get("P.head.weight"))
    torch.testing.assert_close(new_x["head.weight"], x0["head.weight"] + mixed[:, :4], rtol=1e-12, atol=1e-12)
    averaged = x0[lora] + mean_delta[lora]
    assert torch.equal(new_x[lora], averaged) != mix_lora  # mixed with its P only when asked
