"""Client-level privacy accounting with ``dp-accounting`` (Google's library; no hand-written formula).

A round releases the clipped sum plus Gaussian noise of std sigma C over a sampled cohort: one subsampled Gaussian
event per round, composed over the rounds. The unit of privacy is a client (all of its data).

* ``poisson`` sampling (each client joins a round with probability q, independently): ``PoissonSampledDpEvent`` under
  add-or-remove-one neighbours; the RDP accountant (Mironov, "Renyi Differential Privacy", CSF 2017,
  arXiv:1702.07476) or the tighter PLD accountant (Koskela, Jalko, Honkela, AISTATS 2020, arXiv:1906.03049;
  Doroshenko et al., PETS 2022, arXiv:2207.04380).
* ``fixed`` sampling (S of N without replacement, fedhf's default): ``SampledWithoutReplacementDpEvent`` under
  replace-one neighbours (Wang, Balle, Kasiviswanathan, "Subsampled Renyi Differential Privacy and Analytical
  Moments Accountant", AISTATS 2019, arXiv:1808.00087), RDP only. Replacing a client moves the clipped sum by up to
  2C, so the noise multiplier the event gets is sigma / 2.

Adaptive clipping adds a noisy count of std sigma_b per round. Each client's bit is centred, b_i - 1/2 (as
tensorflow_privacy's ``QuantileEstimatorQuery`` sends it), so one client moves the count by 1/2 under add-or-remove
and by at most 1 under replace-one, half of what it moves the sums by (C and 2C) in units of C: Andrew et al.
(NeurIPS 2021, arXiv:1905.03871, Theorem 1) then show the pair is one Gaussian mechanism with
z = (z_delta^-2 + (2 sigma_b)^-2)^-1/2 under either relation, so the accountant composes that z, and the sums get
z_delta (:func:`adaptive_noise_split`). (An uncentred bit in {0, 1} would double the count's sensitivity under
add-or-remove, and the true z would be (z_delta^-2 + sigma_b^-2)^-1/2.)

Against a party that knows who took part (the server of a distributed-DP run), sampling amplifies nothing: a
participating client's release is the plain Gaussian, composed over the rounds it took part in
(:meth:`PrivacyAccountant.epsilon_without_sampling`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

SAMPLINGS = ("fixed", "poisson")
ACCOUNTANTS = ("rdp", "pld")
PLD_GRID = 1e-3


def _library():
    """dp-accounting, imported when DP is used (the ``privacy`` extra), so fedhf imports without it."""
    try:
        import dp_accounting
    except ImportError:
        raise ImportError("Differential privacy needs the dp-accounting package: pip install 'fedhf[privacy]' "
                          "(dp-accounting==0.6.0).") from None
    return dp_accounting


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The RDP accountant logs an absl warning for every small order it cannot evaluate; they say nothing a user
    can act on, so they are silenced while it runs."""
    from absl import logging as absl_logging

    level = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(level)


def round_event(noise_multiplier: float, sampling: str, num_clients: int, cohort: int):
    """One round's event: the Gaussian of std ``noise_multiplier * C`` on a sampled cohort (``cohort`` = S for
    fixed sampling, the expected qN for Poisson)."""
    dp_accounting = _library()
    if sampling == "poisson":
        return dp_accounting.PoissonSampledDpEvent(cohort / num_clients, dp_accounting.GaussianDpEvent(noise_multiplier))
    if sampling == "fixed":  # replace-one: sensitivity 2C
        return dp_accounting.SampledWithoutReplacementDpEvent(
            num_clients, cohort, dp_accounting.GaussianDpEvent(noise_multiplier / 2.0))
    raise ValueError(f"client sampling must be one of {SAMPLINGS}, got {sampling!r}")


def fresh_accountant(kind: str, sampling: str):
    dp_accounting = _library()
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    Relation = dp_accounting.NeighboringRelation
    relation = Relation.REPLACE_ONE if sampling == "fixed" else Relation.ADD_OR_REMOVE_ONE
    if kind == "rdp":
        return RdpAccountant(neighboring_relation=relation)
    if kind == "pld":
        if sampling == "fixed":
            raise ValueError("the PLD accountant has no event for fixed-size sampling without replacement: use "
                             "dp_accountant='rdp' or client_sampling='poisson'")
        # a 1e-3 grid of privacy losses: 9x faster to build than the default 1e-4, and its epsilon (still an upper
        # bound: the discretisation is pessimistic) moves in the sixth digit
        return PLDAccountant(neighboring_relation=relation, value_discretization_interval=PLD_GRID)
    raise ValueError(f"dp_accountant must be one of {ACCOUNTANTS}, got {kind!r}")


class PrivacyAccountant:
    """Epsilon spent after r rounds of one fixed mechanism (sigma, sampling, N, cohort) at ``delta``.

    Its state is the number of rounds composed; :meth:`epsilon` composes them afresh, so a resumed run (which
    restores the count) reports exactly what an uninterrupted one does."""

    def __init__(self, noise_multiplier: float, delta: float, sampling: str, num_clients: int, cohort: int,
                 kind: str = "rdp") -> None:
        self.noise_multiplier, self.delta, self.sampling = float(noise_multiplier), float(delta), sampling
        self.num_clients, self.cohort, self.kind = int(num_clients), int(cohort), kind
        self.rounds = 0
        fresh_accountant(kind, sampling)  # refuses an unsupported pair now

    def event(self, rounds: int):
        return _library().SelfComposedDpEvent(
            round_event(self.noise_multiplier, self.sampling, self.num_clients, self.cohort), rounds)

    def epsilon(self, rounds: int = None) -> float:
        rounds = self.rounds if rounds is None else rounds
        if rounds == 0:
            return 0.0
        if self.noise_multiplier == 0:
            return math.inf
        with _quiet():
            accountant = fresh_accountant(self.kind, self.sampling)
            accountant.compose(self.event(rounds))
            return float(accountant.get_epsilon(self.delta))

    def epsilon_without_sampling(self, rounds: int) -> float:
        """Epsilon of ``rounds`` participations seen by someone who knows the cohort: the Gaussian of every round a
        client took part in, not amplified by sampling (the same neighbouring relation, so sigma / 2 for
        replace-one's sensitivity 2C); RDP."""
        if rounds == 0:
            return 0.0
        if self.noise_multiplier == 0:
            return math.inf
        dp_accounting = _library()
        from dp_accounting.rdp import RdpAccountant

        replace_one = self.sampling == "fixed"
        relation = dp_accounting.NeighboringRelation
        gaussian = dp_accounting.GaussianDpEvent(self.noise_multiplier / 2.0 if replace_one else self.noise_multiplier)
        with _quiet():
            accountant = RdpAccountant(neighboring_relation=relation.REPLACE_ONE if replace_one
                                       else relation.ADD_OR_REMOVE_ONE)
            accountant.compose(gaussian, rounds)
            return float(accountant.get_epsilon(self.delta))

    def step(self) -> float:
        """One more round composed; returns the epsilon spent so far."""
        self.rounds += 1
        return self.epsilon()


def calibrate_noise(target_epsilon: float, delta: float, rounds: int, sampling: str, num_clients: int, cohort: int,
                    kind: str = "rdp") -> float:
    """The smallest noise multiplier (to about 1e-5) whose epsilon after ``rounds`` rounds is at most
    ``target_epsilon``, by ``dp_accounting.calibrate_dp_mechanism``; nudged up until the target is met from below.

    PLD's search is bracketed by RDP's answer (RDP's epsilon is the larger, so its sigma is an upper end): a PLD of a
    far too small sigma would take gigabytes to build."""
    dp_accounting = _library()
    make_event: Callable[[float], object] = lambda sigma: dp_accounting.SelfComposedDpEvent(
        round_event(sigma, sampling, num_clients, cohort), rounds)
    bracket = dp_accounting.LowerEndpointAndGuess(1e-3, 1.0)
    if kind == "pld":
        high = calibrate_noise(target_epsilon, delta, rounds, sampling, num_clients, cohort, "rdp")
        low = high / 2
        while low > 1e-2 and PrivacyAccountant(low, delta, sampling, num_clients, cohort, kind).epsilon(rounds) \
                <= target_epsilon:
            low /= 2
        bracket = dp_accounting.ExplicitBracketInterval(low, high)
    with _quiet():
        sigma = dp_accounting.calibrate_dp_mechanism(
            lambda: fresh_accountant(kind, sampling), make_event, target_epsilon, delta, bracket, tol=1e-5)
    accountant = PrivacyAccountant(sigma, delta, sampling, num_clients, cohort, kind)
    while accountant.epsilon(rounds) > target_epsilon:  # the search's tolerance may land just above the target
        sigma *= 1.0 + 1e-5
        accountant.noise_multiplier = sigma
    return float(sigma)


def adaptive_noise_split(noise_multiplier: float, count_std: float) -> float:
    """The noise multiplier z_delta of the sums when the clipped-count query takes noise ``count_std`` and the
    pair together must be a Gaussian mechanism of ``noise_multiplier`` z (Andrew et al., Theorem 1)."""
    if 2.0 * count_std <= noise_multiplier:
        raise ValueError(f"adaptive clipping's count noise ({count_std}) must exceed half the noise multiplier "
                         f"({noise_multiplier / 2}); raise dp_adaptive_clip_count_std.")
    return (noise_multiplier ** -2 - (2.0 * count_std) ** -2) ** -0.5
