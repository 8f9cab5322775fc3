"""Joint clipping: the clipped message's norm never exceeds C, a message within C is unchanged, the ratios between
its parts are kept; adaptive clipping's update is Andrew et al.'s formula, checked by hand."""

from __future__ import annotations

import math

import torch

from fedhf.privacy import adaptive_clip_update, centred_bit, clip_jointly, joint_norm


def _message(scale: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    return {"dx.w": scale * torch.randn(7, 5, generator=g), "correction.dc.w": scale * torch.randn(7, 5, generator=g),
            "sync.theta.v:w": scale * torch.rand(3, generator=g)}


def test_the_clipped_norm_is_at_most_c_for_every_size():
    for seed, scale in enumerate([1e-6, 0.1, 1.0, 37.0, 1e8]):
        message = _message(scale, seed)
        clipped, norm = clip_jointly(message, 0.75)
        assert math.isclose(norm, math.sqrt(sum(float(t.double().pow(2).sum()) for t in message.values())))
        assert joint_norm(clipped) <= 0.75
        if norm > 0.75:  # shrunk to the bound, not below it
            assert math.isclose(joint_norm(clipped), 0.75, rel_tol=1e-9)


def test_a_message_within_c_is_unchanged_and_parts_keep_their_ratio():
    small = _message(1e-3, 0)
    clipped, _ = clip_jointly(small, 10.0)
    assert all(torch.equal(clipped[k], small[k].double()) for k in small)
    big = _message(100.0, 1)
    clipped, norm = clip_jointly(big, 1.0)
    factors = {k: (clipped[k] / big[k].double()).flatten() for k in big}
    first = factors["dx.w"][0]
    assert all(torch.allclose(f, first.expand_as(f), rtol=1e-12) for f in factors.values())  # one joint factor
    assert math.isclose(float(first), 1.0 / norm, rel_tol=1e-9)


def test_adaptive_update_is_andrew_et_al_geometric_step_on_centred_bits():
    # 6 of 10 expected clients below C: the centred bits sum to 6 x 1/2 + 4 x (-1/2) = 1, unshifted to 1/10 + 1/2;
    # target quantile 0.5, eta 0.2: C exp(-0.2 (0.6 - 0.5))
    bits = [centred_bit(0.5, 1.0)] * 6 + [centred_bit(1.5, 1.0)] * 4
    assert bits[0] == 0.5 and bits[-1] == -0.5 and sum(bits) == 1.0
    assert math.isclose(adaptive_clip_update(2.0, sum(bits), 10, 0.5, 0.2), 2.0 * math.exp(-0.02))
    # the noisy fraction is clamped to [0, 1]
    assert math.isclose(adaptive_clip_update(2.0, -8.0, 10, 0.5, 0.2), 2.0 * math.exp(0.1))
    assert math.isclose(adaptive_clip_update(2.0, 25.0, 10, 0.5, 0.2), 2.0 * math.exp(-0.1))
