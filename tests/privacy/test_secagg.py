"""Secure aggregation's numerics: the unmasked aggregate equals the quantised plaintext sum exactly (integers), also
when clients drop after masking; a masked vector alone looks nothing like the client's; rounding is unbiased."""

from __future__ import annotations

import pytest
import torch

from fedhf.privacy import SecAggCodec
from fedhf.privacy.secagg import MODULUS, masked_bytes


def _clients(n: int):
    g = torch.Generator().manual_seed(3)
    return {c: {"dx.w": torch.randn(6, 4, generator=g) * 0.3, "correction.dc.b": torch.randn(5, generator=g)}
            for c in range(n)}


def _sum(parts):
    keys = parts[0].keys()
    return {k: sum(p[k] for p in parts) for k in keys}


def test_masked_sum_equals_quantised_plaintext_sum_exactly():
    codec = SecAggCodec(bits=16, clip_range=1.0, seed=7)
    messages = _clients(5)
    cohort = [4, 0, 2, 1, 3]
    quantised = {c: codec.quantise(m, round_index=3, client=c) for c, m in messages.items()}
    masked = {c: codec.mask(quantised[c], 3, c, cohort) for c in cohort}
    plain = _sum(list(quantised.values()))
    total = codec.remove_dropped(_sum(list(masked.values())), 3, cohort, [])  # the self masks out
    assert all(torch.equal(total[k], plain[k]) for k in plain)  # exact integers
    # and a masked vector is not its quantised vector (masks do hide it)
    assert not torch.equal(masked[0]["dx.w"], quantised[0]["dx.w"])
    decoded = codec.decode(total, len(cohort))
    exact = _sum([{k: v.double().clamp(-1, 1) for k, v in m.items()} for m in messages.values()])
    assert all((decoded[k] - exact[k]).abs().max() <= len(cohort) * codec.step for k in exact)


def test_dropped_clients_masks_are_removed_exactly():
    codec = SecAggCodec(bits=12, clip_range=2.0, seed=1)
    messages = _clients(6)
    cohort = list(range(6))
    quantised = {c: codec.quantise(m, 0, c) for c, m in messages.items()}
    masked = {c: codec.mask(quantised[c], 0, c, cohort) for c in cohort}
    survivors, dropped = [0, 2, 3, 5], [1, 4]  # 1 and 4 masked, then never sent
    total = _sum([masked[c] for c in survivors])
    assert not all(torch.equal(total[k] % MODULUS, _sum([quantised[c] for c in survivors])[k]) for k in total)
    recovered = codec.remove_dropped(total, 0, survivors, dropped)
    plain = _sum([quantised[c] for c in survivors])
    assert all(torch.equal(recovered[k], plain[k]) for k in plain)


def test_stochastic_rounding_is_unbiased_and_within_range():
    codec = SecAggCodec(bits=4, clip_range=1.0, seed=0)
    x = {"v": torch.full((200_000,), 0.123)}
    q = codec.quantise(x, 0, 0)["v"]
    assert int(q.min()) >= 0 and int(q.max()) <= codec.levels
    mean = float(codec.decode({"v": q.sum().reshape(1)}, 200_000)["v"]) / 200_000
    # rounding error per element is at most one step (0.133); its mean over 2e5 has std < 0.067/sqrt(2e5) = 1.5e-4
    assert abs(mean - 0.123) < 1e-3  # ~6.6 stds: a false failure has probability < 1e-10


def test_decodable_cohort_and_bytes():
    codec = SecAggCodec(bits=20, clip_range=1.0, seed=0)
    assert codec.max_clients * codec.levels < MODULUS <= (codec.max_clients + 1) * codec.levels
    assert masked_bytes({"a": torch.Size([3, 4])}, partners=2) == 4 * 12 + 2 * 160


def test_a_late_upload_of_a_dropped_client_does_not_decode_after_the_recovery():
    """Double masking (Bonawitz et al. 2017): the recovery reveals a dropped client's pair seeds, never its self
    mask, so its masked upload arriving after the deadline is still hidden (REVIEW Part A, N8)."""
    codec = SecAggCodec(bits=12, clip_range=2.0, seed=1)
    messages = _clients(4)
    cohort = list(range(4))
    quantised = {c: codec.quantise(m, 0, c) for c, m in messages.items()}
    masked = {c: codec.mask(quantised[c], 0, c, cohort) for c in cohort}
    survivors, late = [0, 1, 2], 3
    recovered = codec.remove_dropped(_sum([masked[c] for c in survivors]), 0, survivors, [late])
    plain = _sum([quantised[c] for c in survivors])
    assert all(torch.equal(recovered[k], plain[k]) for k in plain)
    shapes = {k: v.shape for k, v in masked[late].items()}
    pair = {k: sum(codec.pair_masks(0, late, s, shapes)[k] * (1 if late < s else -1) for s in survivors)
            for k in shapes}  # what the recovery told the server
    attempt = {k: (masked[late][k] - pair[k]) % MODULUS for k in shapes}
    for key in shapes:
        matches = (attempt[key] == quantised[late][key]).double().mean().item()
        assert matches < 0.01  # uniform noise mod 2^32, not the client's 12-bit values
    with pytest.raises(ValueError, match="both survivors and dropped"):
        codec.remove_dropped(recovered, 0, survivors, [2])
