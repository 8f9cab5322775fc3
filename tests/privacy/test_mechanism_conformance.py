"""Every client-level DP mechanism of the registry (fedhf/privacy/mechanisms/) keeps the interface's promises.

Each registry entry has a conformance entry below (what it declares); the suite is parametrised over the registry,
so a new mechanism is checked as soon as its registry line exists: the registry is the dp_mode choices; what it
declares (where the noise goes, secure aggregation, what the server knows) is what it does and what the config
refuses; with zero noise the released sum is the hand-computed clipped sum; with noise the released sum's noise has
std z_sums C at S_min reports (a fixed generator, a stated tolerance), and a round is released exactly when the
mechanism's noise is all there; adaptive clipping's count is noised by count_std; the accountant is the plan's and
calibration round-trips (the noise from a target epsilon spends that epsilon, and a little less noise would not).
"""

from __future__ import annotations

import math

import pytest
import torch

from fedhf.privacy import PrivacyAccountant
from fedhf.privacy.mechanisms import MECHANISMS, DPMechanism, MechanismPlan, build_mechanism
from fedhf.trainer.config.privacy_settings import DP_MODES
from tests.helpers import config

# dp_mode -> what its mechanism declares (a new mechanism: its class, its registry line, and its entry here)
CONFORMANCE = {
    "central": dict(noise_on_clients=False, noise_on_server=True, needs_secure_aggregation=False,
                    server_knows_cohort=False),
    "distributed": dict(noise_on_clients=True, noise_on_server=False, needs_secure_aggregation=True,
                        server_knows_cohort=True),
}
MODES = sorted(MECHANISMS)
C = 0.5
S = 8  # the reports of a round, = the plan's S_min
ELEMENTS = 20_000  # per key: the sample std of 2 x 20,000 draws has a spread of 0.35 %; the tolerance is 5.7 of it
STD_TOLERANCE = 0.02


def plan(**overrides) -> MechanismPlan:
    values = dict(delta=1e-5, rounds=10, sampling="fixed", num_clients=100, cohort=S, expected_cohort=S,
                  accountant="rdp", noise_multiplier=1.3, min_survivors=S)
    values.update(overrides)
    return MechanismPlan(**values)


def updates():
    """S fixed messages of two keys, given out of sorted order: an even client i sends 3 (i + 1) on coordinate i of
    ``a`` (norm above C: clipped to C e_i), an odd client C / 2 on coordinate i of ``b`` (below C: sent as it is)."""
    messages = []
    for i in range(S):
        a, b = torch.zeros(ELEMENTS), torch.zeros(ELEMENTS)
        if i % 2 == 0:
            a[i] = 3.0 * (i + 1)
        else:
            b[i] = C / 2
        messages.append({"b": b, "a": a})  # out of sorted order on purpose
    return messages


def clipped_sum_by_hand():
    """The sum of the clipped messages: C on a's even coordinates, C / 2 on b's odd ones."""
    a, b = torch.zeros(ELEMENTS, dtype=torch.float64), torch.zeros(ELEMENTS, dtype=torch.float64)
    a[0:S:2] = C
    b[1:S:2] = C / 2
    return {"a": a, "b": b}


def release(mechanism: DPMechanism, messages, z_sums: float, seed: int = 0):
    """What the hook does, in its order: each client clips (and adds its share), the sum, the server's noise."""
    sent = []
    for i, message in enumerate(messages):
        clipped, _ = mechanism.clip(message, C)
        if mechanism.noise_on_clients:
            clipped = mechanism.noised(clipped, mechanism.client_noise_std(z_sums, C),
                                       torch.Generator().manual_seed(1000 * seed + i))
        sent.append(clipped)
    total = {k: sum(m[k] for m in sent) for k in sorted(sent[0])}
    if mechanism.noise_on_server:
        total = mechanism.noised(total, mechanism.server_noise_std(z_sums, C),
                                 torch.Generator().manual_seed(1000 * seed + 999))
    return total


def test_the_registry_is_the_dp_mode_choices_and_each_has_a_conformance_entry():
    assert set(MECHANISMS) == set(CONFORMANCE)
    assert DP_MODES == ("off", *MECHANISMS) and "off" not in MECHANISMS


@pytest.mark.parametrize("mode", MODES)
def test_a_mechanism_declares_what_its_entry_says(mode):
    cls = MECHANISMS[mode]
    assert issubclass(cls, DPMechanism) and cls.name == mode
    assert {k: getattr(cls, k) for k in CONFORMANCE[mode]} == CONFORMANCE[mode]
    assert cls.noise_on_clients or cls.noise_on_server  # some noise somewhere
    assert isinstance(build_mechanism(mode, plan()), cls)


@pytest.mark.parametrize("mode", MODES)
def test_the_config_refuses_the_mode_without_the_secure_aggregation_it_declares_it_needs(mode, tmp_path):
    settings = dict(dp_mode=mode, dp_clip_norm=C, dp_noise_multiplier=1.0)
    if MECHANISMS[mode].needs_secure_aggregation:
        with pytest.raises(ValueError, match="secure_aggregation"):
            config(tmp_path, **settings)
        config(tmp_path, secure_aggregation=True, **settings)
    else:
        assert config(tmp_path, **settings).dp_mode == mode


@pytest.mark.parametrize("mode", MODES)
def test_with_zero_noise_the_release_is_the_hand_computed_clipped_sum(mode):
    mechanism = build_mechanism(mode, plan(noise_multiplier=0.0))
    z = mechanism.noise_multiplier()
    assert z == 0.0 and mechanism.client_noise_std(z, C) == 0.0 and mechanism.server_noise_std(z, C) == 0.0
    for message in updates():
        clipped, norm = mechanism.clip(message, C)
        assert math.sqrt(sum(float(v.pow(2).sum()) for v in clipped.values())) <= C
        assert norm == pytest.approx(math.sqrt(sum(float(v.double().pow(2).sum()) for v in message.values())))
    released, expected = release(mechanism, updates(), z), clipped_sum_by_hand()
    assert sorted(released) == ["a", "b"]
    for key in expected:  # the clip's factor is shrunk by 1e-12 (clipping.py): exact up to that
        torch.testing.assert_close(released[key], expected[key], rtol=1e-11, atol=0.0)


@pytest.mark.parametrize("mode", MODES)
def test_the_released_sum_carries_noise_of_std_z_sums_c_at_s_min_reports(mode):
    mechanism = build_mechanism(mode, plan())
    z = mechanism.noise_multiplier()
    z_sums = mechanism.sums_noise_multiplier(z)
    assert z == 1.3 and z_sums == z  # fixed C: the sums get all of z
    client, server = mechanism.client_noise_std(z_sums, C), mechanism.server_noise_std(z_sums, C)
    assert (client > 0) == mechanism.noise_on_clients and (server > 0) == mechanism.noise_on_server
    assert math.sqrt(S * client ** 2 + server ** 2) == pytest.approx(z_sums * C, rel=1e-12)  # the stated std
    expected = clipped_sum_by_hand()
    noise = torch.cat([release(mechanism, updates(), z_sums)[k] - expected[k] for k in sorted(expected)])
    assert abs(float(noise.mean())) < 4 * z_sums * C / math.sqrt(noise.numel())  # centred
    assert float(noise.std()) == pytest.approx(z_sums * C, rel=STD_TOLERANCE)


@pytest.mark.parametrize("mode", MODES)
def test_a_round_is_released_exactly_when_its_noise_is_all_there(mode):
    """At S_min reports every mechanism releases; below, one whose noise is split over the clients does not (the
    survivors' shares carry less than z C), one whose server adds all of it does."""
    mechanism = build_mechanism(mode, plan())
    assert mechanism.releases(S) and mechanism.releases(S + 1)
    assert mechanism.releases(S - 1) == (not mechanism.noise_on_clients)
    assert mechanism.releases(0) == (not mechanism.noise_on_clients)


@pytest.mark.parametrize("mode", MODES)
def test_the_noise_draws_follow_the_sorted_keys_not_the_order_given(mode):
    mechanism = build_mechanism(mode, plan())
    values = {"b": torch.zeros(5, dtype=torch.float64), "a": torch.ones(3, dtype=torch.float64)}
    one = mechanism.noised(values, 0.7, torch.Generator().manual_seed(3))
    other = mechanism.noised(dict(reversed(list(values.items()))), 0.7, torch.Generator().manual_seed(3))
    assert list(one) == ["a", "b"] and all(torch.equal(one[k], other[k]) for k in values)
    by_hand = torch.randn(8, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 0.7
    assert torch.equal(one["a"], 1.0 + by_hand[:3])  # a's draws first: it sorts first


@pytest.mark.parametrize("mode", MODES)
def test_the_codec_range_holds_a_clipped_message_with_its_share_of_the_noise(mode):
    mechanism = build_mechanism(mode, plan())
    z_sums = mechanism.sums_noise_multiplier(mechanism.noise_multiplier())
    limit = mechanism.codec_range(z_sums, C)
    assert limit == pytest.approx(C * (1 + 4 * mechanism.client_noise_std(z_sums, C) / C), rel=1e-12)
    clipped, _ = mechanism.clip({"a": torch.full((ELEMENTS,), 3.0)}, C)  # every element C / sqrt(n)
    sent = mechanism.noised(clipped, mechanism.client_noise_std(z_sums, C), torch.Generator().manual_seed(5))
    outside = float((sent["a"].abs() > limit).double().mean())
    assert outside < 2e-4  # beyond C plus 4 stds of the share: 6e-5 at most (none without client noise)


@pytest.mark.parametrize("mode", MODES)
def test_adaptive_clipping_splits_z_and_noises_the_count_by_count_std(mode):
    """Andrew et al.'s split (z = 1, count std 0.6: z_sums = (1 - 1.2^-2)^-1/2 = 1.809), and the count's noise recovered from C's updates over 20,000 draws (its sample std's spread 0.5 %; tolerance 3 %)."""
    expected, lr, quantile = 100, 0.2, 0.5
    mechanism = build_mechanism(mode, plan(noise_multiplier=1.0, adaptive_quantile=quantile, adaptive_lr=lr,
                                           count_std=0.6, expected_cohort=expected))
    assert mechanism.adaptive and not build_mechanism(mode, plan()).adaptive
    assert mechanism.sums_noise_multiplier(1.0) == pytest.approx((1 - 1.2 ** -2) ** -0.5, rel=1e-12)
    generator = torch.Generator().manual_seed(11)
    counts = torch.tensor([(math.log(mechanism.next_clip_norm(C, 0.0, generator) / C) / -lr + quantile - 0.5)
                           * expected for _ in range(20_000)], dtype=torch.float64)
    assert float(counts.std()) == pytest.approx(0.6, rel=0.03)
    assert abs(float(counts.mean())) < 4 * 0.6 / math.sqrt(counts.numel())
    with pytest.raises(ValueError, match="dp_adaptive_clip_count_std"):  # a count noise too small for the split
        build_mechanism(mode, plan(adaptive_quantile=quantile, count_std=0.5)).sums_noise_multiplier(1.3)


CALIBRATIONS = [dict(sampling="fixed", accountant="rdp", cohort=10),
                dict(sampling="poisson", accountant="pld", cohort=10, rounds=3)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("setting", CALIBRATIONS, ids=lambda s: f"{s['sampling']}-{s['accountant']}")
def test_calibration_round_trips_through_the_mechanisms_accountant(mode, setting):
    """The noise calibrated to a target epsilon spends that epsilon (from below, within 1e-3 of it), 1e-4 less
    noise would exceed it, and the accountant is the plan's subsampled Gaussian."""
    target = 3.0
    mechanism = build_mechanism(mode, plan(noise_multiplier=None, target_epsilon=target, **setting))
    z = mechanism.noise_multiplier()
    accountant = mechanism.accountant(z)
    assert isinstance(accountant, PrivacyAccountant)
    assert (accountant.sampling, accountant.kind, accountant.cohort, accountant.num_clients, accountant.delta) == \
        (setting["sampling"], setting["accountant"], setting["cohort"], 100, 1e-5)
    rounds = mechanism.plan.rounds
    spent = accountant.epsilon(rounds)
    assert target * (1 - 1e-3) <= spent <= target
    assert mechanism.accountant(z * (1 - 1e-4)).epsilon(rounds) > target
    assert build_mechanism(mode, plan(noise_multiplier=z)).noise_multiplier() == z  # a given z is kept


@pytest.mark.parametrize("mode", MODES)
def test_the_release_report_says_what_the_server_can_know(mode):
    """A mechanism whose server knows the cohort reports the epsilon without amplification by sampling (one
    participation, and every round); the others add nothing beside dp_epsilon."""
    mechanism = build_mechanism(mode, plan())
    accountant = mechanism.accountant(1.3)
    accountant.rounds = 4
    report = mechanism.release_report(accountant)
    if mechanism.server_knows_cohort:
        assert report == {"dp_epsilon_vs_server_one_round": accountant.epsilon_without_sampling(1),
                          "dp_epsilon_vs_server_every_round": accountant.epsilon_without_sampling(4)}
        assert report["dp_epsilon_vs_server_every_round"] > accountant.epsilon(4)  # no amplification
    else:
        assert report == {}
