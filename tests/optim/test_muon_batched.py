"""BatchedMuon (an option) against torch.optim.Muon: the same math, Newton-Schulz batched per oriented shape."""

import pytest
import torch

from fedhf.optim import MuonAdamW
from fedhf.optim.muon_batched import BatchedMuon, batched_newton_schulz
from torch.optim._muon import _zeropower_via_newtonschulz

from tests.helpers import step_alike

COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# A LoRA model's factors (A: r x d, B: d x r, the tall B iterated as its transpose) and a full layer's weights.
LORA = [(4, 24), (24, 4), (4, 24), (24, 4), (4, 48), (48, 4)]
FULL = [(24, 24), (24, 24), (48, 24), (24, 48), (3, 24)]


def _trajectories(shapes, steps=3, **batched):
    torch.manual_seed(0)
    start = [torch.randn(*s) * 0.1 for s in shapes]
    ours = [torch.nn.Parameter(w.clone()) for w in start]
    ref = [torch.nn.Parameter(w.clone()) for w in start]
    opt = BatchedMuon(ours, lr=0.02, weight_decay=0.01, **batched)
    reference = torch.optim.Muon(ref, lr=0.02, weight_decay=0.01)
    step_alike(opt, reference, ours, ref, steps)
    return ours, ref, opt, reference


@pytest.mark.parametrize("shapes", [LORA, FULL])
def test_native_bfloat16_batches_are_torch_muon(shapes):
    """matmul="bfloat16": the same bfloat16 operations as torch, one batched call per shape: at these sizes bit for
    bit, parameters and momentum buffers."""
    ours, ref, opt, reference = _trajectories(shapes, matmul="bfloat16")
    for p, q in zip(ours, ref):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["momentum_buffer"], reference.state[q]["momentum_buffer"])



@pytest.mark.parametrize("adjust_lr_fn", ["original", "match_rms_adamw"])
def test_each_lr_adjustment_is_torch_muons(adjust_lr_fn):
    """torch's adjust_lr_fn, bit for bit (native bfloat16 iterations): "match_rms_adamw" scales a (rows, cols)
    matrix's lr by 0.2 sqrt(max(rows, cols)), "original" by sqrt(max(1, rows / cols))."""
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(*s) * 0.1) for s in LORA + FULL]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = BatchedMuon(ours, lr=0.02, weight_decay=0.01, adjust_lr_fn=adjust_lr_fn, matmul="bfloat16")
    reference = torch.optim.Muon(ref, lr=0.02, weight_decay=0.01, adjust_lr_fn=adjust_lr_fn)
    step_alike(opt, reference, ours, ref, steps=2)
    for p, q in zip(ours, ref):
        assert torch.equal(p, q)

@pytest.mark.parametrize("shapes", [LORA, FULL])
def test_float32_accumulation_stays_within_bfloat16_rounding_of_torch(shapes):
    """matmul="float32_accumulate" (the default on CPUs without bfloat16 units): each parameter is within 2 % of
    one step's size (lr = 0.02 per unit entry; bfloat16 keeps 8 bits) of torch's after 3 steps; the momenta, which
    never see bfloat16, are equal."""
    ours, ref, opt, reference = _trajectories(shapes, matmul="float32_accumulate")
    assert opt.param_groups[0]["matmul"] == "float32_accumulate"
    for p, q in zip(ours, ref):
        assert (p - q).abs().max() <= 0.02 * 0.02 * max(1.0, (p.shape[0] / p.shape[1]) ** 0.5)
        assert torch.equal(opt.state[p]["momentum_buffer"], reference.state[q]["momentum_buffer"])


def test_gram_iteration_is_torch_muon_without_its_bfloat16_rounding():
    """iteration="gram": three steps of torch.optim.Muon's math written out in float64 by hand (EMA momentum with
    Nesterov, NS5 of the wide orientation, weight decay, sqrt(max(1, rows / cols)) lr scale) agree to float32
    rounding; torch's own bfloat16 iteration is up to ~0.025 per unit entry off it, so it is not the reference."""
    a, b, c = COEFFICIENTS
    torch.manual_seed(0)
    start = [torch.randn(*s) * 0.1 for s in LORA + FULL]
    ours = [torch.nn.Parameter(w.clone()) for w in start]
    opt = BatchedMuon(ours, lr=0.02, weight_decay=0.01, iteration="gram")
    exact, bufs = [w.double() for w in start], [torch.zeros(w.shape, dtype=torch.float64) for w in start]
    for _ in range(3):
        for i, p in enumerate(ours):
            p.grad = torch.randn(p.shape)
            g = p.grad.double()
            bufs[i] += 0.05 * (g - bufs[i])
            u = g + 0.95 * (bufs[i] - g)
            tall = u.shape[0] > u.shape[1]
            x = (u.T if tall else u) / u.norm()
            for _ in range(5):
                gram = x @ x.T
                x = a * x + (b * gram + c * gram @ gram) @ x
            scale = max(1.0, u.shape[0] / u.shape[1]) ** 0.5
            exact[i] = exact[i] * (1 - 0.02 * 0.01) - 0.02 * scale * (x.T if tall else x)
        opt.step()
    for p, e in zip(ours, exact):
        assert (p.double() - e).abs().max() <= 1e-6


@pytest.mark.parametrize("option", [{"matmul": "float32_accumulate"}, {"iteration": "gram"}])
def test_float32_options_are_as_close_to_torch_as_torch_is_to_float32(option):
    """The variant's distance from torch's NS5 is no larger than torch's own bfloat16 error against the float32
    iteration (so it keeps the math up to bfloat16 rounding), on a 64 x 96 and a tall 96 x 8 matrix (the Gram form
    runs on the latter)."""
    torch.manual_seed(1)
    a, b, c = COEFFICIENTS
    for shape in [(64, 96), (96, 8)]:
        u = torch.randn(*shape)
        torch_ns = _zeropower_via_newtonschulz(u, COEFFICIENTS, 5, 1e-7).float()
        ours = batched_newton_schulz([u], **option)[0].float()
        x = (u.T if shape[0] > shape[1] else u) / u.norm()
        for _ in range(5):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        exact = x.T if shape[0] > shape[1] else x
        assert ours.shape == shape
        assert (ours - torch_ns).norm() <= 1.5 * (torch_ns - exact).norm()


def test_muon_adamw_batched_option_and_refusals():
    weight, bias = torch.nn.Parameter(torch.randn(6, 4)), torch.nn.Parameter(torch.zeros(6))
    assert isinstance(MuonAdamW([("w", weight), ("b", bias)], newton_schulz="batched").muon, BatchedMuon)
    assert isinstance(MuonAdamW([("w", weight), ("b", bias)]).muon, torch.optim.Muon)  # the default stays torch's
    gram = MuonAdamW([("w", weight), ("b", bias)], newton_schulz="gram").muon
    assert isinstance(gram, BatchedMuon) and gram.param_groups[0]["iteration"] == "gram"
    with pytest.raises(ValueError, match="newton_schulz"):
        MuonAdamW([("w", weight)], newton_schulz="svd")
    with pytest.raises(ValueError, match="newton_schulz"):
        MuonAdamW([("w", weight)], ortho="svd", newton_schulz="batched")
    with pytest.raises(ValueError, match="matmul"):
        BatchedMuon([weight], matmul="float16")
    with pytest.raises(ValueError, match="leave `matmul` unset"):
        BatchedMuon([weight], iteration="gram", matmul="bfloat16")


@pytest.mark.parametrize("native", [False, True])
def test_default_matmul_follows_the_hardware(monkeypatch, native):
    """Both answers of the hardware probe (fedhf.trainer.config.config_checks.cpu_has_bf16_matmul), whatever CPU runs the test."""
    from fedhf.optim.muon_batched import default_matmul

    monkeypatch.setattr("fedhf.optim.muon_batched.cpu_has_bf16_matmul", lambda: native)
    assert default_matmul(torch.device("cpu")) == ("bfloat16" if native else "float32_accumulate")
    assert default_matmul(torch.device("cuda")) == "bfloat16"


def test_a_state_dict_saved_before_the_iteration_option_still_loads():
    """Checkpoints of BatchedMuon written before ``iteration`` existed resume with the standard iteration."""
    weight = torch.nn.Parameter(torch.randn(6, 4))
    weight.grad = torch.randn(6, 4)
    old = BatchedMuon([weight])
    old.step()
    saved = old.state_dict()
    del saved["param_groups"][0]["iteration"]
    resumed = BatchedMuon([weight], iteration="gram")
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["iteration"] == "standard"
    resumed.step()
