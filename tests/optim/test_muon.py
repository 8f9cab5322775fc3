"""Local Muon: orthogonalised updates, routing, and the conformance every local optimizer must pass."""

from __future__ import annotations


import torch

from fedhf.optim import MuonAdamW
from fedhf.optim.muon import route_to_muon

from tests.helpers import lora_minilm


def _ill_conditioned_gradient(rows=32, cols=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, cols, generator=g))
    v, _ = torch.linalg.qr(torch.randn(cols, cols, generator=g))
    return u @ torch.diag(torch.logspace(0, -2, cols)) @ v.T  # singular values 1 ... 1e-2


def test_muon_update_has_the_singular_values_of_an_orthogonalised_matrix():
    weight = torch.nn.Parameter(torch.zeros(32, 16))
    bias = torch.nn.Parameter(torch.zeros(16))
    optimizer = MuonAdamW([("w", weight), ("b", bias)], lr=1e-3, muon_lr_mult=10.0, weight_decay=0.0,
                          nesterov=False, momentum=0.0)
    weight.grad, bias.grad = _ill_conditioned_gradient(), torch.ones(16)
    optimizer.step()
    update = -weight.detach() / (1e-3 * 10.0 * (32 / 16) ** 0.5)  # lr scaled by sqrt(rows/cols), "original"
    singular = torch.linalg.svdvals(update)
    assert singular.max() / singular.min() < 2  # the gradient's ratio was 100
    assert 0.5 < singular.min() and singular.max() < 1.5  # Newton-Schulz 5 lands in roughly [0.5, 1.5]
    assert torch.allclose(bias.detach(), torch.full((16,), -1e-3), rtol=1e-3)  # AdamW's first step: -lr sign(g)


def test_routing_sends_lora_matrices_and_head_to_muon(minilm):
    model = lora_minilm(minilm)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    repro = {n for n, p in named if route_to_muon(n, p, "ndim>=2")}
    hidden = {n for n, p in named if route_to_muon(n, p, "hidden_only")}
    assert all(("lora_A" in n or "lora_B" in n or "classifier" in n) and n.endswith("weight") for n in repro)
    assert any("lora_A" in n for n in repro) and any("lora_B" in n for n in repro)
    assert any("classifier" in n for n in repro) and not any("classifier" in n for n in hidden)
    assert hidden == {n for n in repro if "classifier" not in n}


def test_a_conv_filter_is_trained_as_its_flattened_matrix():
    """The papers' rule for a 4-D filter (docs/algorithms.md 1.3): Muon on the (out, in*kh*kw) view, lr scaled by the
    view's shape. Two steps of MuonAdamW on a conv weight = torch.optim.Muon on the flattened matrix, exactly."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3)
    flat = torch.nn.Parameter(conv.weight.detach().reshape(8, -1).clone())
    ours = MuonAdamW([("conv.weight", conv.weight), ("conv.bias", conv.bias)], lr=1e-2, muon_lr_mult=5.0)
    reference = torch.optim.Muon([flat], lr=5e-2, momentum=0.95, nesterov=True, weight_decay=0.01)
    for _ in range(2):
        grad = torch.randn(8, 3, 3, 3)
        conv.weight.grad, conv.bias.grad, flat.grad = grad, torch.randn(8), grad.reshape(8, -1).clone()
        ours.step()
        reference.step()
        assert torch.equal(conv.weight.detach().reshape(8, -1), flat.detach())
    theta = ours.export_theta()
    assert set(theta) == {"momentum_buffer:conv.weight"} and theta["momentum_buffer:conv.weight"].shape == (8, 3, 3, 3)
    assert torch.equal(theta["momentum_buffer:conv.weight"].reshape(8, -1), reference.state[flat]["momentum_buffer"])
    fresh = MuonAdamW([("conv.weight", conv.weight), ("conv.bias", conv.bias)])
    fresh.import_theta(theta)
    assert torch.equal(fresh.export_theta()["momentum_buffer:conv.weight"], theta["momentum_buffer:conv.weight"])


def test_conv_routing_hidden_filters_and_channels_last():
    conv = torch.nn.Conv2d(3, 8, 3)
    assert route_to_muon("layer1.conv.weight", conv.weight, "ndim>=2")
    assert route_to_muon("layer1.conv.weight", conv.weight, "hidden_only")
    assert not route_to_muon("embedder.convolution.weight", conv.weight, "hidden_only")
    assert not route_to_muon("layer1.conv.bias", conv.bias, "ndim>=2")
    channels_last = conv.to(memory_format=torch.channels_last).weight  # no (out, in*kh*kw) view of its storage
    assert not route_to_muon("layer1.conv.weight", channels_last, "ndim>=2")
