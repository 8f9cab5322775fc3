"""State-sync rules: the compression rank rule and its structure-keeping factorisations, the drift metric against
a hand computation, and warm-start semantics."""

from __future__ import annotations

import pytest
import torch

from fedhf.core.sums import RoundSums
from fedhf.core.context import ClientContext, ServerContext
from fedhf.core.client_store import ClientStateStore
from fedhf.metrics import drift, drift_message, spectral_drift
from fedhf.sync import AverageWarmstart, CompressedAverage, PersistLocal, Reset, compression_rank, low_rank
from fedhf.optim import SOAP, Sophia


def test_rank_rule_is_a_fraction_of_the_tensor_size():
    assert compression_rank(768, 768, 0.05) == 19  # floor(0.05 * 768 * 768 / 1537)
    assert compression_rank(16, 768, 0.05) == 1  # floor(0.78) clamped to 1
    low = torch.randn(16, 768)
    recon, floats = low_rank(low, 0.05)  # 1 * (16 + 768 + 1) < 16 * 768: still worth compressing
    assert floats == 785
    tiny = torch.randn(3, 4)
    recon, floats = low_rank(tiny, 0.05)  # r (m + n + 1) = 8 < 12 ... compressed; 2 x 2 would not be
    assert floats == 8
    square = torch.randn(2, 2)
    recon, floats = low_rank(square, 0.05)
    assert floats == 4 and torch.equal(recon, square)  # not smaller: sent dense, exactly


def test_a_low_rank_state_is_reconstructed_exactly_and_others_lose_their_tail():
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(64, 3, generator=g), torch.randn(3, 48, generator=g)
    rank3 = u @ v  # r = floor(0.1 * 64 * 48 / 113) = 2 < 3: loses the third direction
    recon, floats = low_rank(rank3, 0.2)  # r = 5 >= 3: exact
    assert floats == 5 * (64 + 48 + 1)
    torch.testing.assert_close(recon, rank3, rtol=1e-5, atol=1e-5)
    recon2, _ = low_rank(rank3, 0.1)
    s = torch.linalg.svdvals(rank3.double())
    assert float(torch.linalg.matrix_norm((recon2 - rank3).double())) == pytest.approx(float(s[2]), rel=1e-4)


def test_conv_state_is_flattened_to_shape0_by_rest():
    conv = torch.randn(32, 16, 3, 3)  # (32, 144): r = floor(0.05 * 32 * 144 / 177) = 1
    recon, floats = low_rank(conv, 0.05)
    assert recon.shape == conv.shape and floats == 1 * (32 + 144 + 1)


def test_symmetric_factors_stay_psd_and_nonnegative_states_stay_nonnegative():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 60, generator=g)
    factor = x.T @ x / 200  # SOAP's L: symmetric PSD
    recon, floats = low_rank(factor, 0.1, SOAP.theta_kind("GG0"))
    assert floats == 2 * 61  # r = floor(0.1 * 3600 / 121) = 2, eigenvectors + eigenvalues
    assert torch.allclose(recon, recon.T, atol=1e-6) and torch.linalg.eigvalsh(recon.double()).min() > -1e-6
    # Sophia's h, sparse and non-negative: its rank-3 SVD (c = 0.15) has negative entries ...
    h = (torch.rand(40, 50, generator=g) > 0.8).float() * torch.rand(40, 50, generator=g)
    raw, _ = low_rank(h, 0.15, "general")
    clamped, _ = low_rank(h, 0.15, Sophia.theta_kind("hessian"))
    assert raw.min() < 0 and clamped.min() >= 0  # ... which the clamp removes
    assert torch.equal(clamped, raw.clamp_min(0))


def _ctx(sums=None, store=None, weight=1.0, client=0, sync_state=None):
    return ClientContext(client_id=client, round=0, round_lr=0.1, local_lr=0.1, local_steps=1, weight=weight,
                         params={}, global_params={}, correction_state={}, store=ClientStateStore() if store is None else store,
                         sync_state=sync_state or {})


def _contributed(thetas, weights):
    """The round's drift sums after each client contributed its Theta and weight."""
    sums = RoundSums()
    for theta, w in zip(thetas, weights):
        sums.add_message(drift_message(theta, w))
        sums.add("w", w)
    return sums


def test_drift_is_the_weighted_mean_squared_distance_to_the_mean():
    f64 = torch.float64
    thetas = [{"v:a": torch.tensor([1.0, 2.0], dtype=f64), "v:b": torch.tensor([[0.5]], dtype=f64)},
              {"v:a": torch.tensor([3.0, -1.0], dtype=f64), "v:b": torch.tensor([[1.5]], dtype=f64)},
              {"v:a": torch.tensor([0.0, 0.0], dtype=f64), "v:b": torch.tensor([[-2.0]], dtype=f64)}]
    weights = [1.0, 2.0, 3.0]
    sums = _contributed(thetas, weights)
    W = sum(weights)
    mean = {k: sum(w * t[k] for t, w in zip(thetas, weights)) / W for k in thetas[0]}
    by_hand = sum(w * sum(float((t[k] - mean[k]).pow(2).sum()) for k in t) for t, w in zip(thetas, weights)) / W
    got = drift(sums, W)
    assert got["precond_drift"] == pytest.approx(by_hand, rel=1e-12)
    mean_sq = sum(w * sum(float(t[k].pow(2).sum()) for k in t) for t, w in zip(thetas, weights)) / W
    assert got["precond_drift_rel"] == pytest.approx(by_hand / mean_sq, rel=1e-12)


def test_spectral_drift_is_the_weighted_mean_spectral_norm_of_the_distance_to_the_mean():
    """FedPAC Fig. 3 per Theta tensor: sum_i w_i ||Theta_i - Thetabar||_2 / W, with diagonal matrices (whose
    2-norm is their largest |entry|, unlike the Frobenius norm), a conv-shaped tensor read as (out, rest), and a
    1-D (diagonal) state."""
    f64 = torch.float64
    diagonal = [torch.diag(torch.tensor(d, dtype=f64)) for d in ([4.0, 0.0], [0.0, 3.0], [1.0, 1.0])]
    thetas = [{"GG0:w": D, "momentum_buffer:conv": D.reshape(2, 1, 1, 2), "hessian:b": D.diagonal().clone()}
              for D in diagonal]
    weights = [1.0, 2.0, 3.0]
    sums = _contributed(thetas, weights)
    W = sum(weights)
    mean = sum(w * d.diagonal() for d, w in zip(diagonal, weights)) / W  # Thetabar is diagonal too
    by_hand = sum(w * float((d.diagonal() - mean).abs().max()) for d, w in zip(diagonal, weights)) / W
    got = spectral_drift(list(zip(weights, thetas)), sums, W)
    for key in thetas[0]:
        assert got[f"precond_drift_spectral/{key}"] == pytest.approx(by_hand, rel=1e-12)
    assert got["precond_drift_spectral"] == pytest.approx(by_hand, rel=1e-12)
    assert got["precond_drift_spectral_max"] == pytest.approx(by_hand, rel=1e-12)
    frobenius = sum(w * float((d.diagonal() - mean).norm()) for d, w in zip(diagonal, weights)) / W
    assert frobenius > 1.1 * by_hand  # the two norms do differ on these states
    assert spectral_drift([], sums, 0.0) is None


def test_reset_uploads_nothing_average_warmstart_counts_theta_and_averages_it():
    theta = {"v:a": torch.ones(3)}
    sums = RoundSums()
    ctx = _ctx(sums)
    assert not Reset().client_end(ctx, theta)  # sends nothing (the drift metric is a round hook's)
    sums, rule = RoundSums(), AverageWarmstart()
    for w, value in ((1.0, 1.0), (3.0, 5.0)):
        ctx = _ctx(sums, weight=w)
        sent = rule.client_end(ctx, {"v:a": torch.full((3,), value)})
        assert sent.nbytes == 12
        sums.add_message(sent)  # with its w
    server = ServerContext(round=0, round_lr=0.1, local_steps=1, num_clients=2, sums=sums,
                           global_params={"a": torch.zeros(3)}, mean_delta={})
    broadcast = rule.server_update({}, server)["v:a"]
    assert torch.equal(broadcast, torch.full((3,), 4.0)) and broadcast.dtype == torch.float32  # (1 + 15) / 4


class _Recorder:
    def __init__(self):
        self.imported = []

    def import_theta(self, theta):
        self.imported.append(theta)


def test_warm_start_imports_only_when_there_is_something_to_import():
    recorder = _Recorder()
    AverageWarmstart().client_begin(_ctx(RoundSums()), recorder)  # round 0: nothing broadcast yet
    AverageWarmstart().client_begin(_ctx(RoundSums(), sync_state={"v:a": torch.ones(1)}), recorder)
    assert len(recorder.imported) == 1
    store = ClientStateStore()
    PersistLocal().client_begin(_ctx(RoundSums(), store=store, client=4), recorder)  # first participation
    PersistLocal().client_end(_ctx(RoundSums(), store=store, client=4), {"v:a": torch.full((1,), 2.0)})
    PersistLocal().client_begin(_ctx(RoundSums(), store=store, client=4), recorder)
    PersistLocal().client_begin(_ctx(RoundSums(), store=store, client=5), recorder)  # another client: nothing
    assert len(recorder.imported) == 2 and torch.equal(recorder.imported[1]["v:a"], torch.full((1,), 2.0))


def test_compressed_average_counts_the_factorised_bytes():
    sums = RoundSums()
    ctx = _ctx(sums)
    theta = {"momentum_buffer:w": torch.randn(64, 64), "hessian:b": torch.rand(64)}
    sent = CompressedAverage(0.05).client_end(ctx, theta, {"hessian:b": Sophia.theta_kind("hessian")})
    assert sent.nbytes == 4 * (1 * (64 + 64 + 1) + 64)  # r = floor(0.05 * 4096 / 129) = 1; 1-D dense
    with pytest.raises(ValueError, match="fraction"):
        CompressedAverage(1.5)
