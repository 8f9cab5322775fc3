"""The over-selected cohort ceil((1 + o) S) is exact: sampled and accounted alike (REVIEW Part A: with o = 0.1 and
S = 100 the float product 110.00000000000001 sampled and accounted 111 clients)."""

from __future__ import annotations

import math
import types
from fractions import Fraction

from fedhf.trainer.config.clock_policy import sampled_per_round
from fedhf.trainer.config.privacy_settings import accounted_cohort


def _args(per_round: int, over_selection: float):
    return types.SimpleNamespace(clock_profile="lognormal", round_policy="deadline", over_selection=over_selection,
                                 clients_per_round=per_round, num_clients=10_000, round_deadline_s=60.0,
                                 async_concurrency=None, dp_mode="off", client_sampling="fixed")


def test_the_over_selected_cohort_is_the_exact_ceiling_for_every_cohort_up_to_1000():
    for over_selection, exact in ((0.1, Fraction(11, 10)), (0.3, Fraction(13, 10)), (0.25, Fraction(5, 4))):
        for per_round in range(1, 1001):
            args = _args(per_round, over_selection)
            expected = math.ceil(exact * per_round)  # integer arithmetic
            assert sampled_per_round(args) == accounted_cohort(args) == expected, (over_selection, per_round)
    assert sampled_per_round(_args(100, 0.1)) == 110
