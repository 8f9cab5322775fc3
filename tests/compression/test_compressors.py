"""The conformance suite every registered compressor passes: round-trip error bounds, bytes equal to the encoded
tensors' bytes (hand formulas), unbiasedness where declared, scale commutation (messages carry w_i-scaled
tensors), determinism from the generator, and the encoding through safetensors."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from fedhf.compression import COMPRESSORS, Encoded, build_compressor

SPECS = ["none", "bf16", "fp16", "int8", "int8:16", "int4", "int2", "topk:0.1", "topk:1", "powersgd:2"]


def _x(shape=(37, 19), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x[0, 0] = 25.0  # an outlier: blockwise scales keep it in its block
    return x


def _gen(seed=1):
    return torch.Generator().manual_seed(seed)


def test_every_registered_compressor_is_in_the_suite():
    assert {s.split(":")[0] for s in SPECS} == set(COMPRESSORS.names())


def _blocks(x: torch.Tensor, block: int):
    flat = x.reshape(-1).tolist()
    return [flat[i:i + block] for i in range(0, len(flat), block)]


def _bound(spec: str, x: torch.Tensor) -> torch.Tensor:
    """Per-entry error bound, written from each compressor's definition (not from its code)."""
    name, _, arg = spec.partition(":")
    if name == "none":
        return x.abs() * 2.0 ** -24
    if name in ("bf16", "fp16"):
        return x.abs() * 2.0 ** (-8 if name == "bf16" else -11)
    bits = int(name[3:])
    block = int(arg) if arg else (256 if bits == 8 else 64)
    levels = 2 ** (bits - 1) - 1
    steps = [max(abs(v) for v in b) / levels for b in _blocks(x, block) for _ in b]
    return torch.tensor(steps, dtype=torch.float64).reshape(x.shape) * (1 + 1e-6)  # < one step (fp32 scale)


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith(("topk", "powersgd"))])
def test_round_trip_error_is_within_the_compressors_bound(spec):
    c = build_compressor(spec)
    x = _x()
    d = c.decode(c.encode(x, _gen()))
    assert d.dtype == torch.float64 and d.shape == x.shape
    assert ((d - x).abs() <= _bound(spec, x)).all()
    if spec != "none":
        assert not torch.equal(d, x.to(torch.float32).double())  # it did compress


@pytest.mark.parametrize("fraction", [0.1, 0.37, 1.0])
def test_topk_keeps_exactly_the_largest_entries(fraction):
    x = _x()
    c = build_compressor(f"topk:{fraction}")
    d = c.decode(c.encode(x, _gen()))
    k = math.ceil(fraction * x.numel())
    kept = d != 0
    assert int(kept.sum()) == k
    assert torch.equal(d[kept], x[kept].to(torch.float32).double())  # kept entries: exact up to the fp32 cast
    if k < x.numel():
        assert x[kept].abs().min() >= x[~kept].abs().max()
    assert (d - x).pow(2).sum() <= (1 - k / x.numel()) * x.pow(2).sum() + 1e-9


def test_powersgd_projects_and_recovers_a_low_rank_matrix():
    g = _gen(3)
    low = torch.randn(30, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 20, generator=g, dtype=torch.float64)
    c = build_compressor("powersgd:2")
    enc = c.encode(low, _gen())
    assert torch.allclose(c.decode(enc), low, rtol=0, atol=1e-5 * low.abs().max())  # rank 2 in, rank 2 sent
    x = _x()
    d = c.decode(c.encode(x, _gen()))
    assert (x - d).norm() <= x.norm() * (1 + 1e-6)  # a projection never adds energy
    assert torch.linalg.matrix_rank(d.float()) <= 2


def test_powersgd_warm_start_improves_over_rounds_on_a_fixed_matrix():
    """Subspace iteration: reusing Q (the paper's warm start) converges to the top-r subspace."""
    x = _x()
    c = build_compressor("powersgd:2")
    state, errors = None, []
    for _ in range(6):
        enc = c.encode(x, _gen(), state)
        state = enc.state
        errors.append(float((x - c.decode(enc)).norm()))
    s = torch.linalg.svdvals(x)
    best = float(s[2:].pow(2).sum().sqrt())  # Eckart-Young: the best rank-2 error
    assert errors[-1] < errors[0] and errors[-1] <= best * 1.01


def test_powersgd_sends_small_and_1d_tensors_dense():
    c = build_compressor("powersgd:4")
    for x in (torch.randn(50, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)):
        enc = c.encode(x, _gen())
        assert enc.nbytes == 4 * x.numel() and torch.equal(c.decode(enc), x.float().double())


def _expected_bytes(spec: str, shape) -> int:
    n = math.prod(shape)
    name, _, arg = spec.partition(":")
    if name == "none":
        return 4 * n
    if name in ("bf16", "fp16"):
        return 2 * n
    if name.startswith("int"):
        bits = int(name[3:])
        block = int(arg) if arg else (256 if bits == 8 else 64)
        return math.ceil(n * bits / 8) + 4 * math.ceil(n / block)
    if name == "topk":
        return 8 * math.ceil(float(arg) * n)
    rank = int(arg)
    return 4 * rank * (shape[0] + n // shape[0])


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("shape", [(37, 19), (3, 5, 7), (257, 3)])
def test_encoded_bytes_are_the_formula_and_the_wire_tensors_bytes(spec, shape, tmp_path):
    c = build_compressor(spec)
    x = _x(shape) if len(shape) == 2 else torch.randn(shape, dtype=torch.float64)
    enc = c.encode(x, _gen())
    assert enc.nbytes == _expected_bytes(spec, shape)
    # the wire tensors through safetensors: same bytes on disk (payload), same decoded value
    path = str(tmp_path / "enc.safetensors")
    save_file({k: v.contiguous() for k, v in enc.tensors.items()}, path)
    back = load_file(path)
    assert sum(t.numel() * t.element_size() for t in back.values()) == enc.nbytes
    assert torch.equal(c.decode(Encoded(back, enc.shape)), c.decode(enc))


@pytest.mark.parametrize("spec", SPECS)
def test_the_generator_alone_decides_the_draws(spec):
    c = build_compressor(spec)
    x = _x()
    a, b = c.encode(x, _gen(5)), c.encode(x, _gen(5))
    assert a.tensors.keys() == b.tensors.keys()
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)


@pytest.mark.parametrize("spec", SPECS)
def test_compression_commutes_with_a_positive_scale(spec):
    """Messages carry w_i x: compressing the scaled tensor is the scaled compression of x (up to fp32 scales)."""
    c, x, w = build_compressor(spec), _x(), 0.37
    scaled, plain = c.decode(c.encode(w * x, _gen(7))), c.decode(c.encode(x, _gen(7)))
    tol = 1e-2 if spec in ("bf16", "fp16") else 1e-5  # a 16-bit cast rounds w x and x to different neighbours
    assert torch.allclose(scaled, w * plain, rtol=tol, atol=tol * float(x.abs().max()) * w)


@pytest.mark.parametrize("spec", [s for s in SPECS if build_compressor(s).unbiased])
def test_declared_unbiased_compressors_average_to_the_input(spec):
    c = build_compressor(spec)
    x = _x((8, 32))
    draws = 3000
    mean = sum(c.decode(c.encode(x, _gen(seed))) for seed in range(draws)) / draws
    step = _bound(spec, x) if spec.startswith("int") else torch.zeros_like(x)
    # stochastic rounding: each draw is off by < one step, variance <= step^2 / 4; 6 standard deviations
    assert ((mean - x).abs() <= 6 * step / (2 * math.sqrt(draws)) + 2.0 ** -23 * x.abs()).all()


@pytest.mark.parametrize("spec", ["bf16", "topk:0.1", "powersgd:2"])
def test_declared_biased_compressors_are_biased(spec):
    """The declaration is honest: a deterministic compressor's mean is its one output, which is not x."""
    c = build_compressor(spec)
    assert not c.unbiased
    x = _x()
    assert not torch.allclose(c.decode(c.encode(x, _gen())), x, rtol=0, atol=1e-4)


def test_only_the_identity_is_declared_linear():
    """Per-client block scales, top-k supports and PowerSGD bases differ between clients: adding two clients'
    codes does not decode to the sum, so only ``none`` may claim linearity."""
    assert [s for s in SPECS if build_compressor(s).linear] == ["none"]
    c = build_compressor("int8")
    x1, x2 = _x(seed=1), 3 * _x(seed=2)
    e1, e2 = c.encode(x1, _gen()), c.encode(x2, _gen())
    added = Encoded({"codes": (e1.tensors["codes"].int() + e2.tensors["codes"].int()).to(torch.int8),
                     "scale": e1.tensors["scale"]}, e1.shape)
    assert not torch.allclose(c.decode(added), x1 + x2, atol=0.1)


@pytest.mark.parametrize("bad", ["int9", "topk:0", "topk:x", "powersgd:0", "int8:-1", "bf16:3", "none:1"])
def test_bad_specs_are_refused_with_the_reason(bad):
    with pytest.raises(ValueError):
        build_compressor(bad)


def test_fp16_overflow_is_refused_not_sent_as_inf():
    with pytest.raises(ValueError, match="overflows"):
        build_compressor("fp16").encode(torch.tensor([1e6], dtype=torch.float64), _gen())
