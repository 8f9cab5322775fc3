"""Local Muon: orthogonalised updates, routing, and the conformance every local optimizer must pass."""

from __future__ import annotations


import torch

from fedhf.optim import MuonAdamW
from fedhf.optim.muon import route_to_muon

from ..helpers import lora_minilm


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
