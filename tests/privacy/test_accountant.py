"""The accountant is dp-accounting's, on the events fedhf's rounds are: its epsilon equals the library called
directly; a published value is reproduced; calibration reaches the target from below."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from fedhf.privacy import PrivacyAccountant, adaptive_noise_split, calibrate_noise
from fedhf.privacy.accountant import round_event


def test_poisson_epsilon_equals_dp_accounting_called_directly():
    ours = PrivacyAccountant(1.1, 1e-5, "poisson", num_clients=500, cohort=25, kind="rdp")
    direct = RdpAccountant()
    direct.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1)), 40)
    assert ours.epsilon(40) == direct.get_epsilon(1e-5)
    pld = PrivacyAccountant(1.1, 1e-5, "poisson", num_clients=500, cohort=25, kind="pld")
    direct = PLDAccountant(value_discretization_interval=1e-3)
    direct.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1)), 40)
    assert pld.epsilon(40) == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)
    assert pld.epsilon(40) < ours.epsilon(40)  # PLD is the tighter of the two


def test_fixed_size_sampling_is_replace_one_with_sensitivity_2c():
    ours = PrivacyAccountant(2.0, 1e-5, "fixed", num_clients=300, cohort=10, kind="rdp")
    direct = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    direct.compose(dp_accounting.SampledWithoutReplacementDpEvent(300, 10, dp_accounting.GaussianDpEvent(1.0)), 30)
    assert ours.epsilon(30) == direct.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="PLD accountant has no event for fixed-size"):
        PrivacyAccountant(2.0, 1e-5, "fixed", num_clients=300, cohort=10, kind="pld")


def test_abadi_et_al_published_moments_accountant_value_is_reproduced():
    """Abadi et al. (CCS 2016, section 3.1): q = 0.01, sigma = 4, delta = 1e-5, T = 10,000 steps gives
    epsilon ~= 1.26 with the moments accountant. Its conversion is min over integer orders of
    rdp(alpha) + log(1/delta) / (alpha - 1); applied to the RDP curve of our round event it gives 1.26."""
    orders = np.arange(2, 64)
    accountant = RdpAccountant(orders=list(orders))
    accountant.compose(round_event(4.0, "poisson", num_clients=100, cohort=1), 10_000)
    moments_epsilon = float(np.min(accountant.rdp + math.log(1e5) / (orders - 1)))
    assert round(moments_epsilon, 2) == 1.26
    # and today's tighter RDP conversion, through our accountant, is below the published bound
    assert PrivacyAccountant(4.0, 1e-5, "poisson", 100, 1).epsilon(10_000) < 1.26


@pytest.mark.parametrize("kind,sampling", [("pld", "poisson"), ("rdp", "fixed")])  # PLD calibrates through RDP
def test_calibration_reaches_the_target_from_below(kind, sampling):
    sigma = calibrate_noise(3.0, 1e-5, rounds=10, sampling=sampling, num_clients=400, cohort=20, kind=kind)
    accountant = PrivacyAccountant(sigma, 1e-5, sampling, 400, 20, kind)
    assert accountant.epsilon(10) <= 3.0
    accountant.noise_multiplier = sigma * (1 - 1e-3)  # a hair less noise overshoots: sigma is the smallest
    assert accountant.epsilon(10) > 3.0


def test_epsilon_grows_with_rounds_and_step_counts_them():
    accountant = PrivacyAccountant(1.0, 1e-5, "poisson", 100, 10)
    spent = [accountant.step() for _ in range(3)]
    assert accountant.rounds == 3 and spent[0] < spent[1] < spent[2]
    assert spent[2] == accountant.epsilon(3) and accountant.epsilon(0) == 0.0
    assert PrivacyAccountant(0.0, 1e-5, "poisson", 100, 10).epsilon(1) == math.inf


def test_adaptive_split_is_andrew_et_al_theorem_1():
    z_delta = adaptive_noise_split(1.0, 2.0)
    assert math.isclose((z_delta ** -2 + (2 * 2.0) ** -2) ** -0.5, 1.0)  # the pair is one z = 1 mechanism
    assert math.isclose(z_delta, (1 - 1 / 16) ** -0.5)
    with pytest.raises(ValueError, match="raise dp_adaptive_clip_count_std"):
        adaptive_noise_split(1.0, 0.4)


def test_epsilon_without_sampling_is_the_plain_gaussian_composed():
    """What a party that knows the cohort sees: no amplification (fixed sampling: replace-one, sigma / 2)."""
    ours = PrivacyAccountant(1.3, 1e-5, "fixed", num_clients=300, cohort=10)
    direct = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    direct.compose(dp_accounting.GaussianDpEvent(0.65), 4)
    assert ours.epsilon_without_sampling(4) == direct.get_epsilon(1e-5)
    assert ours.epsilon_without_sampling(4) > ours.epsilon(4) and ours.epsilon_without_sampling(0) == 0.0
