"""The conformance every local optimizer passes, run over the whole registry (one test per optimizer/variant):

1. the loss falls below 0.6 x its start in 40 full-batch steps on a learnable toy problem;
2. a state_dict round trip is exact (a twin loaded from it steps to bit-identical parameters);
3. import_theta(export_theta()) is the identity, and an imported Theta is what the optimizer then holds.

Every step runs as the trainer runs it: ``before_forward`` (with .grad empty), forward, backward, ``step``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fedhf.optim import LOCAL_OPTIMIZERS, FederatedOptimizer, LocalOptimizer, ModelAccess

#: registry name[variant] -> (kwargs with an lr that suits the toy problem, the state keys forming Theta).
CASES = {
    "sgd": ({"lr": 0.5}, set()),
    "adamw": ({"lr": 1e-2}, {"exp_avg_sq"}),
    "muon": ({"lr": 1e-2}, {"momentum_buffer"}),  # the two weight matrices only
    "muon[sum svd]": ({"lr": 1e-2, "momentum_form": "sum", "ortho": "svd", "nesterov": False}, {"momentum_buffer"}),
    "muon[batched]": ({"lr": 1e-2, "newton_schulz": "batched"}, {"momentum_buffer"}),
    "muon[gram]": ({"lr": 1e-2, "newton_schulz": "gram"}, {"momentum_buffer"}),
    "soap": ({"lr": 3e-2}, {"GG0", "GG1"}),  # L and R of the matrices; biases have no factor
    "soap[before power_qr]": ({"lr": 3e-2, "factor_update": "before", "eigenbasis_refresh": "power_qr"},
                              {"GG0", "GG1"}),
    "amsgrad": ({"lr": 1e-2}, {"max_exp_avg_sq"}),
    "amsgrad[no max]": ({"lr": 1e-2, "amsgrad": False}, {"exp_avg_sq"}),
    "covariance_adam": ({"lr": 1e-2}, {"P"}),
    "foof": ({"lr": 0.3}, {"A"}),
    "sophia[gnb]": ({"lr": 1e-2, "weight_decay": 0.0, "hessian_estimator": "gnb"}, {"hessian"}),
    "sophia[hutchinson]": ({"lr": 1e-2, "weight_decay": 0.0, "hessian_estimator": "hutchinson"}, {"hessian"}),
    "sophia[empirical_fisher]": ({"lr": 1e-2, "weight_decay": 0.0, "hessian_estimator": "empirical_fisher"},
                                 {"hessian"}),
    "sophia[m and h]": ({"lr": 1e-2, "weight_decay": 0.0, "momentum_in_theta": True}, {"hessian", "exp_avg"}),
}


def test_every_registered_optimizer_has_a_conformance_case():
    assert {case.partition("[")[0] for case in CASES} == set(LOCAL_OPTIMIZERS.names())


def _toy(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    x = torch.randn(128, 8)
    return model, {"x": x, "labels": (x @ torch.randn(8, 3)).argmax(1)}


def _build(case, model, batch):
    spec = LocalOptimizer(case.partition("[")[0], CASES[case][0])
    optimizer = spec.build(dict(model.named_parameters()), spec.lr)
    if getattr(optimizer, "needs_model", False):
        logits = lambda b: model(b["x"])  # noqa: E731
        optimizer.attach(ModelAccess(model, loss=lambda b: F.cross_entropy(logits(b), b["labels"]), logits=logits,
                                     batches=lambda: iter([batch])))
    return optimizer


def _steps(model, optimizer, batch, first, n):
    losses = []
    for step in range(first, first + n):
        optimizer.zero_grad(set_to_none=True)
        if hasattr(optimizer, "before_forward"):
            optimizer.before_forward(step, batch)
        loss = F.cross_entropy(model(batch["x"]), batch["labels"])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("case", sorted(CASES))
def test_conformance(case):
    model, batch = _toy()
    optimizer = _build(case, model, batch)
    losses = _steps(model, optimizer, batch, 0, 40)
    assert losses[-1] < 0.6 * losses[0], losses

    twin, _ = _toy()
    twin.load_state_dict(model.state_dict())
    twin_optimizer = _build(case, twin, batch)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # as if saved and loaded
    for m, o in ((model, optimizer), (twin, twin_optimizer)):
        torch.manual_seed(1)  # curvature estimators draw random labels / probes: the same draws for both
        _steps(m, o, batch, 40, 3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))

    theta = optimizer.export_theta()
    assert {key.partition(":")[0] for key in theta} == CASES[case][1]
    if not isinstance(optimizer, FederatedOptimizer):
        return  # torch.optim classes export Theta (for the drift metric) but cannot import it
    fresh = _build(case, copy.deepcopy(model), batch)
    fresh.import_theta(theta)
    again = fresh.export_theta()
    assert again.keys() == theta.keys() and all(torch.equal(again[k], theta[k]) for k in theta)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_closure_step_returns_its_loss_and_makes_the_same_update(case):
    """torch's protocol: ``step(closure)`` evaluates the closure (loss + backward) with gradients enabled,
    returns its loss, and moves the parameters exactly as ``loss.backward(); step()`` does."""
    runs = []
    for use_closure in (False, True):
        model, batch = _toy()
        optimizer = _build(case, model, batch)
        torch.manual_seed(1)
        losses = []

        def closure():
            loss = F.cross_entropy(model(batch["x"]), batch["labels"])
            loss.backward()
            return loss

        for step in range(3):
            optimizer.zero_grad(set_to_none=True)
            if hasattr(optimizer, "before_forward"):
                optimizer.before_forward(step, batch)
            if use_closure:
                with torch.no_grad():  # the closure must still get its gradients
                    losses.append(optimizer.step(closure).item())
            else:
                losses.append(closure().item())
                optimizer.step()
        runs.append((model, losses))
    (plain, plain_losses), (closed, closed_losses) = runs
    assert closed_losses == plain_losses
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), closed.parameters()))


def _tensor_bytes(value) -> int:
    """Bytes of every tensor in a (nested) state dict."""
    if torch.is_tensor(value):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_declared_state_size_is_the_real_one(case):
    """The memory plan's optimizer row (LocalOptimizer.state_bytes, from shapes alone) equals the bytes of the
    state the optimizer really holds after its first steps (SOAP's bases and Sophia's h exist from step 1)."""
    model, batch = _toy()
    spec = LocalOptimizer(case.partition("[")[0], CASES[case][0])
    declared = spec.state_bytes(dict(model.named_parameters()))
    optimizer = _build(case, model, batch)
    _steps(model, optimizer, batch, 0, 2)
    assert declared == _tensor_bytes(optimizer.state_dict()) > (0 if case != "sgd" else -1)


def test_sgd_with_momentum_declares_its_buffer():
    model, batch = _toy()
    spec = LocalOptimizer("sgd", {"lr": 0.1, "momentum": 0.9})
    optimizer = spec.build(dict(model.named_parameters()), 0.1)
    _steps(model, optimizer, batch, 0, 1)
    assert spec.state_bytes(dict(model.named_parameters())) == _tensor_bytes(optimizer.state_dict()) == 4 * 195  # 8*16 + 16 + 16*3 + 3 parameters
