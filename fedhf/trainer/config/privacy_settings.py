"""The privacy settings: their fields (:class:`PrivacySettings`, a base of ``FederatedConfig``), their values,
checked when the config is made (before any work), and what follows from them: the delta, the cohorts, the
mechanism of the ``dp_mode`` with its plan (:func:`dp_mechanism`: the noise, its calibration and accountant live in
fedhf/privacy/mechanisms/) and the secure-aggregation codec's range. The round hook: fedhf/trainer/hooks/privacy.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ...privacy import ACCOUNTANTS, SAMPLINGS
from ...privacy.mechanisms import MECHANISMS, DPMechanism, MechanismPlan, build_mechanism
from ...privacy.secagg import SecAggCodec
from .clock_policy import sampled_per_round
from ...core.choices import not_one_of

DP_MODES = ("off", *MECHANISMS)  # "off", then each registered mechanism (fedhf/privacy/mechanisms/)


@dataclass
class PrivacySettings:
    r"""
    Client-level differential privacy and simulated secure aggregation (docs/privacy.md), a base of
    :class:`fedhf.FederatedConfig` (each parameter is its flag or recipe key).

    Parameters:
        client_sampling (`str`, defaults to `"fixed"`): how a round's clients are drawn (fixed size or Poisson).
        dp_mode (`str`, defaults to `"off"`): client-level differential privacy: off, central or distributed noise.
        dp_clip_norm (`float`, *optional*): the bound C on the joint L2 norm of each client's message.
        dp_epsilon (`float`, *optional*): the target (or budget) epsilon; sigma is calibrated to it when not given.
        dp_delta (`float`, *optional*): delta; default 1 / num_clients^1.1.
        dp_noise_multiplier (`float`, *optional*): sigma (noise std sigma C on the sum).
        dp_accountant (`str`, defaults to `"rdp"`): rdp or pld (tighter; Poisson sampling only).
        dp_stop_at_budget (`bool`, defaults to `False`): stop before a round would exceed dp_epsilon.
        dp_adaptive_clip_quantile (`float`, *optional*): adaptive clipping's target quantile of the norms.
        dp_adaptive_clip_lr (`float`, defaults to `0.2`): adaptive clipping's step on log C.
        dp_adaptive_clip_count_std (`float`, *optional*): noise std of the clipped count; default cohort / 20.
        dp_min_survivors (`int`, *optional*): distributed DP: the fewest clients a round may be released with.
        dp_reproducible_noise (`bool`, defaults to `False`): noise from the seed (tests only; voids the guarantee).
        secure_aggregation (`bool`, defaults to `False`): simulate secure aggregation (masked, quantised sums).
        secagg_bits (`int`, defaults to `20`): bits per element of the fixed-point encoding.
        secagg_range (`float`, *optional*): the encoding's range [-c, c]; default C under DP, else 8.0.
    """

    client_sampling: str = field(
        default="fixed",
        metadata={"help": "How a round's clients are drawn: 'fixed' (clients_per_round of them, without replacement) "
                          "or 'poisson' (each joins with probability clients_per_round / num_clients, the sampling "
                          "client-level DP accounting assumes; the cohort size varies)."})
    dp_mode: str = field(
        default="off",
        metadata={"help": "Client-level differential privacy: 'off', 'central' (each message clipped to dp_clip_norm, "
                          "Gaussian noise sigma C on the sums) or 'distributed' (each client adds its share "
                          "sigma C / sqrt(dp_min_survivors) before a secure sum; needs secure_aggregation)."})
    dp_clip_norm: Optional[float] = field(
        default=None, metadata={"help": "C: every client's whole message (model delta and any state it sends) is "
                                        "scaled to joint L2 norm <= C; with adaptive clipping, the initial C."})
    dp_epsilon: Optional[float] = field(
        default=None, metadata={"help": "Target epsilon: the noise multiplier is calibrated to reach it after "
                                        "num_rounds; with dp_noise_multiplier given, the budget."})
    dp_delta: Optional[float] = field(
        default=None, metadata={"help": "delta of the (epsilon, delta) guarantee; default 1 / num_clients**1.1."})
    dp_noise_multiplier: Optional[float] = field(
        default=None, metadata={"help": "sigma: the noise on the sums has std sigma * C. Default: calibrated to "
                                        "dp_epsilon."})
    dp_accountant: str = field(
        default="rdp", metadata={"help": "Privacy accountant of dp-accounting: 'rdp' or 'pld' (tighter; Poisson "
                                         "sampling only)."})
    dp_stop_at_budget: bool = field(
        default=False, metadata={"help": "Stop the run before a round would spend more than dp_epsilon."})
    dp_adaptive_clip_quantile: Optional[float] = field(
        default=None, metadata={"help": "Adaptive clipping (Andrew et al. 2021): C follows this quantile of the "
                                        "clients' norms, from a noisy count; None = fixed C."})
    dp_adaptive_clip_lr: float = field(
        default=0.2, metadata={"help": "Adaptive clipping's step: C <- C exp(-lr (fraction below C - quantile))."})
    dp_adaptive_clip_count_std: Optional[float] = field(
        default=None, metadata={"help": "Noise std of adaptive clipping's count; default clients_per_round / 20."})
    dp_min_survivors: Optional[int] = field(
        default=None,
        metadata={"help": "Distributed DP: each client's noise share is sized so that this many survivors' shares "
                          "together carry the accounted noise; a round with fewer survivors (clients dropped after "
                          "the masks were agreed) is not released. Default: clients_per_round (any dropout voids "
                          "the round)."})
    dp_reproducible_noise: bool = field(
        default=False,
        metadata={"help": "VOIDS THE PRIVACY GUARANTEE; for tests and debugging only. Draw the DP noise, the noise "
                          "shares and secure aggregation's masks from the run's seed (which the model card prints) "
                          "instead of a secret from the operating system's entropy, so runs repeat exactly. The "
                          "card then says so; refused with push_to_hub."})
    secure_aggregation: bool = field(
        default=False,
        metadata={"help": "Simulate secure aggregation: messages quantised to secagg_bits, masked with pairwise "
                          "masks mod 2^32 that cancel in the sum; the server decodes the sum only. Refused for server "
                          "rules that read individual client updates."})
    secagg_bits: int = field(default=20, metadata={"help": "Bits per element of secure aggregation's encoding."})
    secagg_range: Optional[float] = field(
        default=None, metadata={"help": "Secure aggregation encodes values in [-c, c] (clamped); default the clip "
                                        "norm under DP, else 8.0."})


def dp_on(args) -> bool:
    return args.dp_mode != "off"


def dp_delta(args) -> float:
    """The given delta, else 1 / N^1.1 (below 1/N, as a client-level guarantee needs)."""
    return args.dp_delta if args.dp_delta is not None else 1.0 / args.num_clients ** 1.1


def count_std(args) -> float:
    """Adaptive clipping's noise on the clipped count: given, else the expected cohort / 20 (Andrew et al.'s
    choice)."""
    if args.dp_adaptive_clip_count_std is not None:
        return args.dp_adaptive_clip_count_std
    return args.clients_per_round / 20.0


def accounted_cohort(args) -> int:
    """The sampled cohort the accountant's event has: every client whose data can enter a round. That is
    clients_per_round, or the over-selected ceil((1 + over_selection) x clients_per_round) of a deadline round
    (any of them may be among the reports kept); clients that then drop (offline, late) only lower a client's
    chance of entering the sums (docs/privacy.md, "Dropped clients")."""
    return sampled_per_round(args)


def expected_cohort(args) -> int:
    """DP-FedAvg's fixed denominator, the expected number of reports a round sums: under Poisson sampling q N,
    the accounted cohort S' (over-selection included: every report within the deadline is kept); under fixed
    sampling clients_per_round (a deadline round keeps at most that many reports)."""
    return accounted_cohort(args) if args.client_sampling == "poisson" else args.clients_per_round


def min_survivors(args) -> int:
    """Distributed DP: the fewest survivors whose shares carry the accounted noise (default the whole cohort)."""
    return args.dp_min_survivors if args.dp_min_survivors is not None else args.clients_per_round


def mechanism_plan(args) -> MechanismPlan:
    """The numbers the ``dp_mode``'s mechanism is built from, with the settings' defaults resolved."""
    return MechanismPlan(delta=dp_delta(args), rounds=args.num_rounds, sampling=args.client_sampling,
                         num_clients=args.num_clients, cohort=accounted_cohort(args),
                         expected_cohort=expected_cohort(args), accountant=args.dp_accountant,
                         noise_multiplier=args.dp_noise_multiplier, target_epsilon=args.dp_epsilon,
                         min_survivors=min_survivors(args), adaptive_quantile=args.dp_adaptive_clip_quantile,
                         adaptive_lr=args.dp_adaptive_clip_lr, count_std=count_std(args))


def dp_mechanism(args) -> DPMechanism:
    """The mechanism of ``dp_mode`` (not "off"), built from the run's plan."""
    return build_mechanism(args.dp_mode, mechanism_plan(args))


def secagg_codec(args, z_sums: Optional[float]) -> SecAggCodec:
    """The codec's range: ``secagg_range`` if set; else under DP what the mechanism's clipped (and noised) messages
    need (the clip norm C, widened by 4 noise stds of a client's share under distributed DP); else 8.0 (Flower's
    default clipping range)."""
    if args.secagg_range is not None:
        clip_range = args.secagg_range
    elif dp_on(args):
        clip_range = dp_mechanism(args).codec_range(z_sums, args.dp_clip_norm)
    else:
        clip_range = 8.0
    return SecAggCodec(args.secagg_bits, clip_range, args.seed)


def check_privacy_fields(args) -> None:
    """Each privacy field's value, with the fix named; the pairs that cannot work are rows of the refusal table
    (fedhf/trainer/config/combinations/), and what the budget allows is :func:`check_privacy_budget`."""
    checks = [
        (args.client_sampling in SAMPLINGS, not_one_of("client_sampling", args.client_sampling, SAMPLINGS)),
        (args.dp_mode in DP_MODES, not_one_of("dp_mode", args.dp_mode, DP_MODES)),
        (args.dp_accountant in ACCOUNTANTS, not_one_of("dp_accountant", args.dp_accountant, ACCOUNTANTS)),
        (args.dp_noise_multiplier is None or args.dp_noise_multiplier >= 0, "`dp_noise_multiplier` must be >= 0"),
        (args.dp_epsilon is None or args.dp_epsilon > 0, "`dp_epsilon` must be > 0"),
        (args.dp_delta is None or 0 < args.dp_delta < 1, "`dp_delta` must be in (0, 1), e.g. 1e-5"),
        (args.dp_adaptive_clip_quantile is None or 0 < args.dp_adaptive_clip_quantile < 1,
         "`dp_adaptive_clip_quantile` must be in (0, 1), e.g. 0.5"),
        (args.dp_adaptive_clip_lr > 0, "`dp_adaptive_clip_lr` must be > 0, e.g. 0.2"),
        (args.dp_adaptive_clip_count_std is None or args.dp_adaptive_clip_count_std > 0,
         "`dp_adaptive_clip_count_std` must be > 0"),
        (1 <= args.secagg_bits <= 31, "`secagg_bits` must be in [1, 31] (the sums live in Z_2^32), e.g. 20"),
        (args.secagg_range is None or args.secagg_range > 0, "`secagg_range` must be > 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message + ".")


def check_privacy_budget(args) -> None:
    """What the noise and the budget allow (after the refusal table's settings rows: the accountant needs a valid
    pairing of sampling and accountant)."""
    if not dp_on(args):
        return
    mechanism = dp_mechanism(args)
    if mechanism.adaptive and args.dp_noise_multiplier is not None:  # raises, naming the fix, when the count's
        mechanism.sums_noise_multiplier(args.dp_noise_multiplier)  # noise is too small for the split
    if args.dp_noise_multiplier is not None and args.dp_epsilon is not None:
        first = mechanism.accountant(args.dp_noise_multiplier).epsilon(1)
        if args.dp_stop_at_budget and first > args.dp_epsilon:  # the run would stop before its first round
            raise ValueError(f"one round at dp_noise_multiplier={args.dp_noise_multiplier} spends epsilon {first:.3g} "
                             f"> dp_epsilon={args.dp_epsilon}: not even the first round fits the budget; raise "
                             "dp_noise_multiplier, or leave it unset to calibrate it to dp_epsilon.")
        planned = mechanism.accountant(args.dp_noise_multiplier).epsilon(args.num_rounds)
        if planned > args.dp_epsilon and not args.dp_stop_at_budget:
            raise ValueError(f"`num_rounds={args.num_rounds}` with dp_noise_multiplier={args.dp_noise_multiplier} "
                             f"spends epsilon {planned:.3g} > dp_epsilon={args.dp_epsilon}: set "
                             "dp_stop_at_budget=True (the run stops before the budget is exceeded), lower num_rounds, "
                             "raise dp_noise_multiplier, or leave it unset to calibrate it.")


def privacy_card_rows(args, history) -> list:
    """The model card's rows for the privacy guarantee (empty when neither DP nor secure aggregation was on): the
    epsilon the whole run spent (every round's release counts, whichever round is saved)."""
    rows = []
    spent = [h for h in history if "dp_epsilon" in h]
    if dp_on(args) and spent:
        last = spent[-1]
        cohort = accounted_cohort(args)
        sampling = (f"Poisson, q = {cohort}/{args.num_clients}" if args.client_sampling == "poisson"
                    else f"fixed size {cohort} of {args.num_clients} without replacement "
                         "(replace-one neighbours)")
        clip = (f"adaptive (quantile {args.dp_adaptive_clip_quantile}), last C = {last['dp_clip_norm']:.4g}"
                if args.dp_adaptive_clip_quantile is not None else f"{last['dp_clip_norm']:.4g}")
        rows += [
            f"| differential privacy | client-level (the unit is one client's whole data), {args.dp_mode} noise |",
            f"| privacy spent (epsilon, delta) | ({last['dp_epsilon']:.4g}, {dp_delta(args):.3g}) after "
            f"{last['round']} rounds |",
            f"| accountant / client sampling | dp-accounting {args.dp_accountant.upper()} / {sampling} |",
            f"| clip norm C / noise multiplier sigma | {clip} / {last['dp_noise_multiplier']:.4g} |",
        ]
        rows.append("| not covered by epsilon | each round's cohort size (`participants`, message totals, the "
                    "clock's columns) and evaluation on the eval_dataset |")
        if "dp_epsilon_vs_server_one_round" in last:
            rows.append(f"| epsilon against the server (it knows the cohort; no amplification by sampling) | "
                        f"{last['dp_epsilon_vs_server_one_round']:.4g} per round a client takes part, "
                        f"{last['dp_epsilon_vs_server_every_round']:.4g} for a client in all {last['round']} rounds |")
    if (dp_on(args) or args.secure_aggregation) and args.dp_reproducible_noise:
        rows.append("| noise | simulation: noise and cohorts reproducible from the seed, no guarantee |")
    if args.secure_aggregation:
        rows.append(f"| secure aggregation (simulated) | {args.secagg_bits}-bit fixed point, pairwise masks mod 2^32 |")
    return rows
