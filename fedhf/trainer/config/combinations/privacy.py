"""Refused combinations of client-level differential privacy and secure aggregation: the privacy settings among
themselves (each field's own value: privacy_settings.py), and what DP or secure aggregation cannot run with
(fedhf/trainer/hooks/privacy.py, docs/privacy.md)."""

from __future__ import annotations

from typing import List, Optional

from ....compression import parse_plan
from ....core.params import federated_buffers
from ....privacy.secagg import SecAggCodec
from ....sharing.plan import PERSONAL
from ..privacy_settings import dp_on
from .refusal import SETTINGS, Refusal, Setup


def _dp(s: Setup) -> bool:
    return s.args.dp_mode != "off"


def _secagg_problem(s: Setup) -> Optional[str]:
    from ....privacy.secagg_check import secagg_compatibility

    compatible, reason = secagg_compatibility(s.algorithm)
    return None if compatible else reason


def _secagg_max_clients(args) -> int:
    return SecAggCodec(args.secagg_bits, 1.0, 0).max_clients


def _secagg_cohort(args) -> int:
    """The most clients one secure sum may hold: every client under Poisson sampling, else the cohort."""
    return max(args.num_clients if args.client_sampling == "poisson" else 0, args.clients_per_round)


# the privacy settings among themselves (read when the config is made)
FIELDS: List[Refusal] = [
    Refusal(lambda s: dp_on(s.args) and not (s.args.dp_clip_norm is not None and s.args.dp_clip_norm > 0),
            lambda s: "differential privacy needs `dp_clip_norm` > 0 (the bound C on each client's message norm), "
                      "e.g. 1.0", needs=SETTINGS),
    Refusal(lambda s: dp_on(s.args) and s.args.dp_noise_multiplier is None and s.args.dp_epsilon is None,
            lambda s: "differential privacy needs a target `dp_epsilon` (the noise is calibrated to it) or a "
                      "`dp_noise_multiplier`", needs=SETTINGS),
    Refusal(lambda s: dp_on(s.args) and s.args.dp_adaptive_clip_quantile is not None
            and s.args.dp_noise_multiplier == 0,
            lambda s: "adaptive clipping needs noise on its count: dp_noise_multiplier=0 gives it none; set "
                      "dp_noise_multiplier > 0 (or dp_adaptive_clip_quantile=None for a fixed dp_clip_norm)",
            needs=SETTINGS),
    Refusal(lambda s: s.args.dp_min_survivors is not None and s.args.dp_mode != "distributed",
            lambda s: "`dp_min_survivors` sizes distributed DP's noise shares: set dp_mode='distributed' or leave it "
                      "unset", needs=SETTINGS),
    Refusal(lambda s: s.args.dp_min_survivors is not None
            and not 1 <= s.args.dp_min_survivors <= s.args.clients_per_round,
            lambda s: f"`dp_min_survivors` must be in [1, clients_per_round={s.args.clients_per_round}]",
            needs=SETTINGS),
    Refusal(lambda s: dp_on(s.args) and s.args.max_update_norm is not None,
            lambda s: "`max_update_norm` excludes a client whose unclipped update norm exceeds it: under DP that "
                      "exclusion is an un-noised function of one client's data (the count and the log would release "
                      "it), and the clip to dp_clip_norm already bounds every client; leave max_update_norm=None",
            needs=SETTINGS),
    Refusal(lambda s: s.args.dp_reproducible_noise and s.args.push_to_hub,
            lambda s: "`dp_reproducible_noise=True` draws the noise from the seed the model card prints, which voids "
                      "the privacy guarantee: it is for tests only and cannot be combined with push_to_hub; set "
                      "dp_reproducible_noise=False", needs=SETTINGS),
    Refusal(lambda s: s.args.dp_reproducible_noise and not dp_on(s.args) and not s.args.secure_aggregation,
            lambda s: "`dp_reproducible_noise` is set but neither dp_mode nor secure_aggregation is on: leave it "
                      "unset", needs=SETTINGS),
    Refusal(lambda s: s.args.dp_adaptive_clip_quantile is not None and s.args.secure_aggregation,
            lambda s: "adaptive clipping's per-client bit (norm <= C) is not part of the secure sum here, so the "
                      "server would see it in the clear: set dp_adaptive_clip_quantile=None (a fixed dp_clip_norm) "
                      "with secure_aggregation", needs=SETTINGS),
    Refusal(lambda s: dp_on(s.args) and s.args.dp_accountant == "pld" and s.args.client_sampling == "fixed",
            lambda s: "the PLD accountant has no event for fixed-size sampling without replacement: set "
                      "dp_accountant='rdp' or client_sampling='poisson'", needs=SETTINGS),
    Refusal(lambda s: s.args.dp_mode == "distributed" and not s.args.secure_aggregation,
            lambda s: "`dp_mode='distributed'` adds a share of the noise on each client, which protects nothing "
                      "unless the server sees only the sum: set secure_aggregation=True (or dp_mode='central')",
            needs=SETTINGS),
    Refusal(lambda s: s.args.dp_mode == "distributed" and s.args.client_sampling != "fixed",
            lambda s: "`dp_mode='distributed'` splits the noise over a known cohort size S; Poisson sampling's "
                      "cohort varies: set client_sampling='fixed' (or dp_mode='central')", needs=SETTINGS),
    Refusal(lambda s: s.args.secure_aggregation and _secagg_cohort(s.args) > _secagg_max_clients(s.args),
            lambda s: f"`secagg_bits={s.args.secagg_bits}` lets at most {_secagg_max_clients(s.args)} clients be "
                      "summed below 2^32; lower secagg_bits or the cohort (clients_per_round)", needs=SETTINGS),
    Refusal(lambda s: not dp_on(s.args) and (
                s.args.dp_epsilon is not None or s.args.dp_noise_multiplier is not None
                or s.args.dp_clip_norm is not None or s.args.dp_adaptive_clip_quantile is not None
                or s.args.dp_stop_at_budget),
            lambda s: "a `dp_*` setting is set but `dp_mode` is 'off': set dp_mode='central' (or 'distributed') to "
                      "use it", needs=SETTINGS),
]

# what DP and secure aggregation cannot run with
WITH_FEATURES: List[Refusal] = [
    Refusal(lambda s: _dp(s) and s.args.client_weighting != "uniform",
            lambda s: f"`client_weighting={s.args.client_weighting!r}` weights clients by their data size, which is "
                      "data-dependent and unbounded, so one client's influence on the sums has no bound under DP",
            "set client_weighting='uniform' (every client weighs 1; the mean divides by the expected cohort)",
            needs=SETTINGS),
    Refusal(lambda s: _dp(s) and s.rule.aggregator.gathers,
            lambda s: f"`server_rule={s.rule.name!r}` reads each client's update, which the noise on the sums does "
                      "not protect", "use a server rule that reads sums (mean, momentum, adam, ...) with dp_mode"),
    Refusal(lambda s: _dp(s) and s.algorithm.state_sync.averages_theta,
            lambda s: f"`state_sync={s.algorithm.state_sync.name!r}` warm-starts every client from the noisy average "
                      "of the optimizer states, which noise can push out of their domain (a negative second moment, "
                      "an indefinite preconditioner)",
            "use state_sync='persist_local' or 'reset' under dp_mode (e.g. algorithm='fadam_gt', whose tracking "
            "state is clipped and noised with the update)"),
    Refusal(lambda s: _dp(s) and s.args.lora_client_ranks is not None,
            lambda s: "`lora_client_ranks` sends per-entry weight masks beside the update, which clipping would "
                      "scale as data", "leave lora_client_ranks unset under dp_mode", needs=SETTINGS),
    Refusal(lambda s: _dp(s) and bool(federated_buffers(s.model)),
            lambda s: "the model has averaged buffers (BatchNorm statistics): under DP their average is noised, and a "
                      "noisy running variance can turn negative",
            "use a model without BatchNorm buffers (LayerNorm, GroupNorm) or turn dp_mode off"),
    Refusal(lambda s: _dp(s) and s.args.drift_spectral,
            lambda s: "`drift_spectral` reads every client's optimizer state, which DP does not release",
            "set drift_spectral=False under dp_mode", needs=SETTINGS),
    # what a DP run releases is what the accountant covers (docs/privacy.md, "What is released")
    Refusal(lambda s: _dp(s) and PERSONAL in s.sharing_roles.values(),
            lambda s: f"`parameter_sharing={s.sharing.preset!r}` keeps personal tensors, and the model fedhf "
                      "evaluates, saves and pushes carries their clients' exact mean, which DP neither clips nor "
                      "noises (and the model is not meaningful without them)",
            lambda s: ("drop the `personal` list from parameter_sharing_kwargs" if s.sharing.preset == "all" else
                       "use parameter_sharing='all'") + " under dp_mode (every trained tensor is then clipped and "
                      "noised), or turn dp_mode off"),
    Refusal(lambda s: _dp(s) and s.rule.aggregator.sends_products,
            lambda s: f"`server_rule={s.rule.name!r}` has each client send its whole LoRA product B_i A_i, not a "
                      "change: DP's clip and fixed denominator (meant for changes) would shrink and rescale the "
                      "adapter itself, so the base moves even when no client changes anything",
            "use server_rule='mean' (A and B averaged as changes) under dp_mode"),
    Refusal(lambda s: _dp(s) and s.rule.aggregator.needs_preconditioners,
            lambda s: f"`server_rule={s.rule.name!r}` inverts the sum of the clients' preconditioners, which the "
                      "noise makes indefinite (an unbounded step)",
            "use a server rule that reads sums without inverting them (mean, momentum, adam, ...) under dp_mode"),
    Refusal(lambda s: _dp(s) and s.args.personalized_eval,
            lambda s: "`personalized_eval` evaluates each client's own model on its own rows and logs the worst "
                      "client: per-client statistics the accountant does not cover",
            "set personalized_eval=False under dp_mode (the global model's eval_dataset metrics stay)",
            needs=SETTINGS),
    # secure aggregation: the server learns the round's sums and no single client's data
    Refusal(lambda s: s.args.secure_aggregation and PERSONAL in s.sharing_roles.values(),
            lambda s: f"`parameter_sharing={s.sharing.preset!r}` keeps personal tensors, whose published mean the "
                      "server forms from each client's unmasked tensors, but `secure_aggregation=True` gives it only "
                      "the sums", "use parameter_sharing='all' or turn secure_aggregation off"),
    Refusal(lambda s: s.args.secure_aggregation and s.args.drift_spectral,
            lambda s: "`drift_spectral` reads every client's optimizer state, but `secure_aggregation=True` gives "
                      "the server only the sums", "set drift_spectral=False or turn secure_aggregation off",
            needs=SETTINGS),
    Refusal(lambda s: s.args.secure_aggregation and s.args.personalized_eval,
            lambda s: "`personalized_eval` evaluates each client's own model and logs per-client statistics, but "
                      "`secure_aggregation=True` gives the server only the sums",
            "set personalized_eval=False or turn secure_aggregation off", needs=SETTINGS),
    Refusal(lambda s: s.args.secure_aggregation and s.args.client_weighting != "uniform",
            lambda s: f"`client_weighting={s.args.client_weighting!r}` sends each client's row count as its weight, "
                      "in the clear beside the masked sums (a 0-d count cannot be masked on the codec's range), and "
                      "scales its values past the codec's range",
            "set client_weighting='uniform' with secure_aggregation", needs=SETTINGS),
    Refusal(lambda s: s.args.secure_aggregation and _secagg_problem(s) is not None,
            lambda s: f"`secure_aggregation=True` gives the server only the sums, but algorithm "
                      f"{s.algorithm.name!r}: {_secagg_problem(s)}",
            "use a server rule that reads sums (e.g. mean) or turn secure_aggregation off"),
    Refusal(lambda s: s.args.secure_aggregation and any(
                not c.linear for c in parse_plan(s.args.uplink_compression, "uplink_compression").compressors()),
            lambda s: f"`uplink_compression={s.args.uplink_compression!r}` encodes each client's tensors with its "
                      "own scales or supports, but `secure_aggregation=True` sums masked fixed-point integers on one "
                      "shared range: the masked sum of differently scaled codes means nothing",
            "leave uplink_compression='none' under secure aggregation (its own b-bit encoding, `secagg_bits`, is "
            "the compression) or turn secure_aggregation off", needs=SETTINGS),
]
