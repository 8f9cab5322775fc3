"""Feature combinations fedhf refuses, in one table, checked before any work.

Each :class:`Refusal` row says when a combination is refused (``when``), what the problem is and the fix, and what it
``needs`` to decide: the settings only (:data:`SETTINGS`: checked when the config is made, by
``FederatedConfig.__post_init__``, and again when the trainer is built, for a field changed since) or the trainer
(:data:`TRAINER`, the default: its algorithm, model, processes or loss, checked when the trainer is built). A value
check of one field stays where the field is parsed (config_checks.py, the ``*_settings`` modules). Rows of a
``group`` are gathered into one message, as one setting's problems (``batched_clients``, ``client_parallel``); a
row without a group is refused alone, the first in table order. A refusal that only a model helper can judge
(which LoRA layers can be stacked or merged into the base) is a row whose ``check`` raises with that helper's own
message. docs/bad_inputs.md lists every refusal with the input that triggers it (tests/trainer/bad_inputs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Union

from transformers import Trainer

from ...compression import parse_plan
from ...core.lora import LORA_A, LORA_B, lora_pairs, role_of
from ...core.params import federated_buffers
from ...privacy.secagg import SecAggCodec
from ...runtime.lora_layers import lora_layers
from ...optim.whole_matrices import is_elementwise
from ...runtime.sharded import sharding_requested
from ...sharing.alternating import ROLORA
from ...sharing.plan import PERSONAL, SHARED
from ..hooks.compression import compressed_model_change
from .clock_settings import clock_on
from .privacy_settings import dp_on


DESLOC_OPTIMIZERS = ("AdamW", "MuonAdamW", "Adam")  # the local optimizers whose moments DES-LOC averages
DESLOC_LOCAL_OPTIMIZERS = ("adamw", "muon")
SETTINGS = "settings"  # the row reads the config's fields only (``s.args``)
TRAINER = "trainer"  # the row reads the built trainer: its algorithm, model, processes or loss


@dataclass
class Setup:
    """What the table reads: the trainer (its args, model, algorithm, sharing and roles, processes, loss), or before
    there is one, the settings alone (``settings``; a :data:`SETTINGS` row reads ``args`` only)."""

    trainer: object
    settings: object = None

    @property
    def args(self):
        return self.settings if self.trainer is None else self.trainer.args

    def __getattr__(self, name):  # the trainer's attributes, read as the rows need them
        if name.startswith("__") or self.__dict__.get("trainer") is None:
            raise AttributeError(f"{name!r}: a row that reads the trainer must not declare needs=SETTINGS")
        return getattr(self.trainer, name)

    @property
    def rule(self):
        return self.trainer.algorithm.server_rule

    @property
    def needs_lora_pairs(self) -> bool:
        return self.rule.aggregator.needs_lora_pairs

    @property
    def shared(self) -> List[str]:
        return [n for n, r in self.trainer.sharing_roles.items() if r == SHARED]

    @property
    def lora(self) -> List[str]:
        return [n for n in self.trainer.sharing_roles if role_of(n) in (LORA_A, LORA_B)]


Text = Callable[[Setup], str]


@dataclass(frozen=True)
class Refusal:
    when: Callable[[Setup], bool]
    problem: Optional[Text] = None
    fix: Union[str, Text] = ""
    group: str = ""
    check: Optional[Callable[[Setup], None]] = None  # a model helper that raises its own message
    needs: str = TRAINER  # or SETTINGS: decided from the config's fields alone, when the config is made

    def message(self, s: Setup) -> str:
        fix = self.fix(s) if callable(self.fix) else self.fix
        return self.problem(s) + (f": {fix}" if fix else "") + "."


def _ranks_above(s: Setup) -> bool:
    pairs = lora_pairs(_trainable(s))
    return bool(pairs) and max(s.args.lora_client_ranks) > _adapter_rank(s)


def _trainable(s: Setup):
    from ...core.params import trainable_parameters
    return trainable_parameters(s.model)


def _adapter_rank(s: Setup) -> int:
    params = _trainable(s)
    return min(params[a].shape[0] for a in lora_pairs(params))


def _overridden_loss(s: Setup) -> List[str]:
    """The shared pass computes each client's loss from the logits (the model's plain mean) and never calls
    ``compute_loss`` or ``training_step``; an override of either (a user's, or trl's SFTTrainer's: its ``dft`` loss,
    MoE auxiliary loss and token metrics) would be skipped silently, so it is refused."""
    from ..federated_trainer import FederatedTrainer  # which imports this table

    cls = type(s.trainer)
    return [name for name in ("compute_loss", "training_step")
            if getattr(cls, name) not in (getattr(Trainer, name), getattr(FederatedTrainer, name))]


def _overridden_text(s: Setup) -> str:
    cls = type(s.trainer)
    return "; ".join(f"an overridden `{name}` ({getattr(cls, name).__qualname__}: the shared pass computes each "
                     f"client's loss from the logits and would skip it; trl's SFTTrainer overrides both)"
                     for name in _overridden_loss(s))


def _ranks(s: Setup) -> bool:
    return s.args.lora_client_ranks is not None


def _batched(s: Setup) -> bool:
    return s.args.batched_clients > 1


def _compressed_delta(s: Setup, linear_ok: bool = False) -> List[str]:
    """The shared tensors whose model change (``dx``) the uplink compresses (non-linear compressors only, when
    ``linear_ok``: a linear one's sum of encodings decodes to the sum, which a sum-reading rule can take)."""
    picked = compressed_model_change(parse_plan(s.args.uplink_compression), s.shared)
    return [name for name, compressor in picked.items() if not (linear_ok and compressor.linear)]


def _compressed_text(s: Setup, why: str, fix: str, linear_ok: bool = False) -> str:
    names = _compressed_delta(s, linear_ok)
    shown = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    return (f"`uplink_compression={s.args.uplink_compression!r}` compresses the model change of {shown}, but "
            f"{why}; {fix}")


_COMPRESS_OTHERS = "compress only other tensors (e.g. 'correction.*=int8,sync.*=bf16') or"


def _dp(s: Setup) -> bool:
    return s.args.dp_mode != "off"


def _secagg_problem(s: Setup) -> Optional[str]:
    from ...privacy.secagg_check import secagg_compatibility

    compatible, reason = secagg_compatibility(s.algorithm)
    return None if compatible else reason


def _secagg_max_clients(args) -> int:
    return SecAggCodec(args.secagg_bits, 1.0, 0).max_clients


def _secagg_cohort(args) -> int:
    """The most clients one secure sum may hold: every client under Poisson sampling, else the cohort."""
    return max(args.num_clients if args.client_sampling == "poisson" else 0, args.clients_per_round)


def _buffered(s: Setup) -> bool:
    return s.args.clock_profile is not None and s.args.round_policy == "fedbuff"


COMBINATIONS: List[Refusal] = [
    # the federation's settings (each field's own value: config_checks.py)
    Refusal(lambda s: s.args.clients_per_round > s.args.num_clients,
            lambda s: f"`clients_per_round`={s.args.clients_per_round} exceeds `num_clients`={s.args.num_clients}; "
                      "lower it or raise num_clients", needs=SETTINGS),
    Refusal(lambda s: (s.args.partition_key == "embedding") != (s.args.partition_encoder is not None),
            lambda s: "`partition_encoder` (a local sentence-encoder folder) is what `partition_key='embedding'` "
                      f"embeds with, and only that key uses it: got partition_key={s.args.partition_key!r}, "
                      f"partition_encoder={s.args.partition_encoder!r}", needs=SETTINGS),
    Refusal(lambda s: s.args.quantity_skew != 0 and s.args.partition == "natural",
            lambda s: "`quantity_skew` does not apply to `partition='natural'` (its sizes are the data's); set it to "
                      "0 or use 'iid'/'dirichlet'", needs=SETTINGS),
    Refusal(lambda s: s.args.personalized_eval and s.args.client_eval_fraction <= 0,
            lambda s: "`personalized_eval` evaluates each client on its held-out rows, but `client_eval_fraction` is "
                      "0: set client_eval_fraction (e.g. 0.1) or personalized_eval=False", needs=SETTINGS),
    # the privacy settings (each field's own value: privacy_settings.py)
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
    # the simulated clock's settings (each field's own value: clock_settings.py)
    Refusal(lambda s: not clock_on(s.args) and (
                s.args.round_policy != "wait_all" or s.args.round_deadline_s is not None or s.args.over_selection != 0
                or s.args.clock_budget_s is not None or s.args.clock_availability != 1),
            lambda s: "a clock setting is set but `clock_profile` is None: set clock_profile='lognormal' (or "
                      "'uniform', or a CSV trace) to simulate time", needs=SETTINGS),
    Refusal(lambda s: s.args.round_policy == "deadline"
            and not (s.args.round_deadline_s is not None and s.args.round_deadline_s > 0),
            lambda s: "`round_policy='deadline'` needs `round_deadline_s` > 0 (the reporting deadline in simulated "
                      "seconds)", needs=SETTINGS),
    Refusal(lambda s: s.args.over_selection != 0 and s.args.round_policy != "deadline",
            lambda s: "`over_selection` only applies to round_policy='deadline' (wait_all keeps every sampled "
                      "client)", needs=SETTINGS),
    Refusal(lambda s: s.args.async_concurrency is not None
            and not (_buffered(s) and s.args.async_concurrency >= s.args.clients_per_round),
            lambda s: "`async_concurrency` applies to round_policy='fedbuff' and must be >= clients_per_round (the "
                      "reports the server waits for)", needs=SETTINGS),
    # FedBuff has no cohort: which clients enter an update follows their devices and the refill order, not a uniform
    # sample, so no subsampled event accounts it (one unamplified Gaussian per update, composed over every update a
    # client may report in, would: not written); the buffer of K reports is formed by arrival order, which no client
    # knows when it masks, so pairwise masks cannot be agreed (deployments sum the buffer in a trusted execution
    # environment instead: Huba et al., "Papaya", MLSys 2022).
    Refusal(lambda s: _buffered(s) and s.args.dp_mode != "off",
            lambda s: "round_policy='fedbuff' has no sampled cohort: the clients in a server update are chosen by "
                      "their devices and the refill order, not by the uniform sampling the DP accountant's "
                      "subsampled event assumes: use round_policy='deadline' (over-selection with a reporting "
                      "deadline) or 'wait_all' under dp_mode", needs=SETTINGS),
    Refusal(lambda s: _buffered(s) and s.args.secure_aggregation,
            lambda s: "round_policy='fedbuff' sums the first clients_per_round reports to arrive, which no client "
                      "knows when it masks, so secure aggregation's pairwise masks cannot be agreed among them: use "
                      "round_policy='deadline' (dropped clients' masks are removed by secure aggregation's "
                      "recovery) or 'wait_all'", needs=SETTINGS),
    Refusal(lambda s: _buffered(s) and s.args.downlink_compression != "none",
            lambda s: "round_policy='fedbuff' sends each client the model of its own moment, but a compressed "
                      "downlink assumes every client holds the server's last broadcast: set "
                      "downlink_compression='none'", needs=SETTINGS),
    # micro-batches of one local step (fedhf/trainer/runners/local_steps.py, ``accumulate``)
    Refusal(lambda s: s.args.gradient_accumulation_steps > 1 and (s.compute_loss_func is not None
                                                                  or s.loss_is_scaled_for_ga),
            lambda s: f"`gradient_accumulation_steps={s.args.gradient_accumulation_steps}` weights each micro-batch "
                      "by its share of the union's items, which needs the model's own mean loss; a "
                      "`compute_loss_func` (or a loss already scaled for accumulation) cannot be weighted so",
            "use gradient_accumulation_steps=1 and a larger per_device_train_batch_size"),
    # buffered asynchronous aggregation on the simulated clock (fedhf/trainer/hooks/clock.py, docs/clock.md)
    Refusal(lambda s: _buffered(s) and s.rule.aggregator.name != "mean",
            lambda s: f"round_policy='fedbuff' weights each report's model change by its staleness, which is defined "
                      f"for a mean of changes; the aggregator {s.rule.aggregator.name!r} reads products, "
                      "preconditioners or each update, computed against different global models",
            "use an algorithm whose server rule averages changes (mean, with any server optimizer after it: fedavg, "
            "fedadam, diloco, ...) or round_policy='wait_all'"),
    Refusal(lambda s: _buffered(s) and s.world.size > 1,
            lambda s: f"round_policy='fedbuff' holds each training client's messages in the process that trained "
                      f"it; this run has {s.world.size} processes",
            "run fedbuff in one process"),
    # client-level differential privacy and secure aggregation (fedhf/trainer/hooks/privacy.py, docs/privacy.md)
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
    # personalised evaluation
    Refusal(lambda s: s.args.personalized_eval and s.world.size > 1,
            lambda s: f"`personalized_eval` runs in one process; this run has {s.world.size}",
            "launch one process or set personalized_eval=False"),
    # parameter sharing x server rule
    Refusal(lambda s: PERSONAL in s.sharing_roles.values() and s.rule.aggregator.needs_preconditioners,
            lambda s: f"`server_rule={s.rule.name!r}` mixes every preconditioned layer on the server, but "
                      "`parameter_sharing` keeps some of them personal; use parameter_sharing='all' or another "
                      "server_rule"),
    Refusal(lambda s: s.sharing.preset == ROLORA and not (any(role_of(n) == LORA_A for n in s.shared)
                                                          and any(role_of(n) == LORA_B for n in s.shared)),
            lambda s: "`parameter_sharing='rolora'` alternates shared LoRA A and B, but the model has no shared "
                      "trainable pair",
            "apply a peft LoRA adapter, or choose another `parameter_sharing`"),
    Refusal(lambda s: s.sharing.preset == ROLORA and s.needs_lora_pairs,
            lambda s: f"`parameter_sharing='rolora'` averages one factor per round; `server_rule={s.rule.name!r}` "
                      "aggregates the product of both. Use one or the other (e.g. server_rule='mean')"),
    # a state sync that keeps the optimizer's whole state (persist_local keep="state", desloc) reads the optimizer's
    # own per-parameter tensors (fedhf/optim/whole_state.py): RoLoRA's frozen-factor view and FSDP's optimizer over
    # gathered whole matrices have none to hand over
    Refusal(lambda s: s.algorithm.state_sync.moves == "state" and s.sharing.preset == ROLORA,
            lambda s: f"`state_sync={s.algorithm.state_sync.name!r}` keeps the optimizer's whole state, but "
                      "`parameter_sharing='rolora'` trains one LoRA factor per round through a view of the optimizer "
                      "that hands over Theta only",
            "use state_sync='reset' or 'persist_local' (keep='theta') with rolora, or another parameter_sharing"),
    # DES-LOC averages Adam's moments by their state names (exp_avg / momentum_buffer, exp_avg_sq): other optimizers'
    # states are other quantities (SOAP's moments live in each client's own eigenbasis, Sophia's curvature and
    # covariance_adam's P are never averaged), so the periods would not mean what DES-LOC says
    Refusal(lambda s: s.algorithm.state_sync.name == "desloc"
            and s.algorithm.local_optimizer.cls.__name__ not in DESLOC_OPTIMIZERS,
            lambda s: f"`state_sync='desloc'` averages Adam's first and second moments at their own periods, but "
                      f"{s.algorithm.local_optimizer.cls.__name__} keeps other state",
            f"use local_optimizer in {list(DESLOC_LOCAL_OPTIMIZERS)}, or state_sync='average_warmstart'"),
    Refusal(lambda s: s.algorithm.state_sync.moves == "state" and _sharded(s)
            and not is_elementwise(s.algorithm.local_optimizer.cls),
            lambda s: f"`state_sync={s.algorithm.state_sync.name!r}` keeps the optimizer's whole state, but under "
                      f"`fsdp` {s.algorithm.local_optimizer.cls.__name__} steps gathered copies of whole matrices "
                      "whose state is not the shards'",
            "use an elementwise optimizer (adamw, sgd) or state_sync='reset' under fsdp"),
    # refuses DoRA, conv LoRA and LoRA on embeddings; fan_in_fan_out only for rules that write into W
    Refusal(lambda s: s.needs_lora_pairs,
            check=lambda s: lora_layers(s.model, allow_fan_in_fan_out=not s.rule.aggregator.folds_into_base)),
    Refusal(lambda s: s.needs_lora_pairs and not s.lora,
            lambda s: f"`server_rule={s.rule.name!r}` aggregates LoRA products, but the model has no trainable "
                      "LoRA A/B", "apply a peft LoRA adapter, or choose another server_rule"),
    Refusal(lambda s: s.needs_lora_pairs and any(s.sharing_roles[n] != SHARED for n in s.lora),
            lambda s: f"`server_rule={s.rule.name!r}` needs every LoRA A and B shared, but "
                      f"`parameter_sharing={s.sharing.preset!r}` keeps some personal or frozen; use "
                      "parameter_sharing='all' (or a personal head/norm) with it"),
    # heterogeneous client ranks (fedhf/sharing/client_ranks.py)
    Refusal(lambda s: _ranks(s) and not lora_pairs(_trainable(s)),
            lambda s: "`lora_client_ranks` truncates LoRA adapters, but the model has no shared LoRA A/B",
            "apply a peft LoRA adapter, or leave lora_client_ranks unset"),
    Refusal(lambda s: _ranks(s) and _ranks_above(s),
            lambda s: f"`lora_client_ranks` asks for rank {max(s.args.lora_client_ranks)}, above the adapter's rank "
                      f"{_adapter_rank(s)}",
            lambda s: "a client trains the first r_i components of the global adapter; use ranks <= "
                      f"{_adapter_rank(s)} or a larger LoraConfig(r=...)"),
    Refusal(lambda s: _ranks(s) and not s.needs_lora_pairs,
            lambda s: "`lora_client_ranks` needs a rule that aggregates the clients' products (flexlora, flora, "
                      f"fedex_lora, fedsvd); `server_rule={s.rule.name!r}` averages A and B, which would average "
                      "zeros into the components a client lacks",
            "use one of those rules (e.g. server_rule='flexlora') or leave lora_client_ranks unset"),
    # A client's optimizer state on the components it lacks is zero (they never get a gradient); averaged in, it
    # would shrink the others' (Adam's v: larger steps; momentum: smaller) on exactly those components.
    Refusal(lambda s: _ranks(s) and s.algorithm.state_sync.averages_theta,
            lambda s: f"`lora_client_ranks` with `state_sync={s.algorithm.state_sync.name!r}`: the averaged "
                      "optimizer state would mix a truncated client's zeros into the components it does not train; "
                      "use state_sync='persist_local' (each client keeps its own) or 'reset'"),
    Refusal(lambda s: _ranks(s) and _batched(s),
            lambda s: f"`batched_clients={s.args.batched_clients}` trains clients together, but `lora_client_ranks` "
                      "truncates each client's adapter differently; set batched_clients=1", needs=SETTINGS),
    # a rule that folds into the base weights (FedEx-LoRA, FLoRA)
    Refusal(lambda s: s.rule.aggregator.folds_into_base and s.args.load_best_model_at_end,
            lambda s: "`load_best_model_at_end=True` keeps the best round's trainable tensors only, but "
                      "`server_rule` folds into the frozen base weights every round; set "
                      "load_best_model_at_end=False (or use round checkpoints) with it"),
    # compression (fedhf/compression/): rules that read something formed from a client's *exact* model change
    Refusal(lambda s: s.needs_lora_pairs and bool(_compressed_delta(s, linear_ok=True)),
            lambda s: _compressed_text(s, f"`server_rule={s.rule.name!r}` aggregates the products B_i A_i of each "
                                          "client's exact factors, and a non-linear compressor (per-client scales, "
                                          "supports or bases) does not keep them",
                                       f"{_COMPRESS_OTHERS} use a server_rule that averages A and B (mean)",
                                       linear_ok=True)),
    Refusal(lambda s: s.rule.aggregator.gathers and bool(_compressed_delta(s)),
            lambda s: _compressed_text(s, f"the robust `server_rule={s.rule.name!r}` gathers each client's "
                                          "uncompressed update", f"{_COMPRESS_OTHERS} use a mean-based server_rule")),
    Refusal(lambda s: s.rule.aggregator.needs_preconditioners and bool(_compressed_delta(s)),
            lambda s: _compressed_text(s, f"`server_rule={s.rule.name!r}` mixes Delta_i P_i formed from each "
                                          "client's exact change", f"{_COMPRESS_OTHERS} use another server_rule")),
    Refusal(lambda s: (s.sharing.preset == ROLORA or s.rule.aggregator.freezes_lora_a) and bool(_compressed_delta(s)),
            lambda s: _compressed_text(s, "a LoRA factor frozen on the clients (`parameter_sharing='rolora'`, "
                                          "`server_rule='fedsvd'`) makes the change a declared-size message that a "
                                          "compressor would skip", f"{_COMPRESS_OTHERS} use parameter_sharing='all'")),
    Refusal(lambda s: parse_plan(s.args.downlink_compression).active
            and (s.needs_lora_pairs or s.rule.aggregator.folds_into_base),
            lambda s: f"`downlink_compression={s.args.downlink_compression!r}` has the clients train from an "
                      f"approximate model, but `server_rule={s.rule.name!r}` forms its LoRA products and base "
                      "residual from the server's exact A and B",
            "leave downlink_compression='none' with it, or use a server_rule that averages A and B (mean)"),
    # batched clients: one message for all the settings that stop clients from sharing a forward/backward
    Refusal(_batched, check=lambda s: _stackable(s.model)),  # names the modules that cannot be stacked
    Refusal(lambda s: _batched(s) and (s.sharing.preset == ROLORA or s.rule.aggregator.freezes_lora_a),
            lambda s: "a LoRA factor frozen on the clients (`parameter_sharing='rolora'`, `server_rule='fedsvd'`)",
            group="batched_clients"),
    Refusal(lambda s: _batched(s) and PERSONAL in s.sharing_roles.values(),
            lambda s: "personal tensors (`parameter_sharing`: each client would need its own copy loaded)",
            group="batched_clients"),
    Refusal(lambda s: _batched(s) and bool(federated_buffers(s.model)),
            lambda s: "the model has averaged buffers (BatchNorm statistics would mix the clients' rows)",
            group="batched_clients"),
    Refusal(lambda s: _batched(s) and bool(s.args.neftune_noise_alpha),
            lambda s: "`neftune_noise_alpha` (its noise is drawn per forward pass)", group="batched_clients"),
    Refusal(lambda s: _batched(s) and bool(s.args.label_smoothing_factor),
            lambda s: "`label_smoothing_factor` (the per-client loss is the model's plain loss)",
            group="batched_clients"),
    Refusal(lambda s: _batched(s) and s.compute_loss_func is not None,
            lambda s: "a `compute_loss_func` (the per-client loss is computed from the logits)",
            group="batched_clients"),
    Refusal(lambda s: _batched(s) and bool(_overridden_loss(s)), _overridden_text, group="batched_clients"),
    # client-parallel: one message likewise
    Refusal(lambda s: s.args.client_parallel and _batched(s),
            lambda s: f"`batched_clients={s.args.batched_clients}` (set it to 1: a batched chunk cannot be split "
                      "across processes)", group="client_parallel"),
    Refusal(lambda s: s.args.client_parallel and bool(federated_buffers(s.model)),
            lambda s: "a model with averaged buffers (BatchNorm statistics of a row shard are not the batch's)",
            group="client_parallel"),
    Refusal(lambda s: s.args.client_parallel and (s.compute_loss_func is not None or s.loss_is_scaled_for_ga),
            lambda s: "a `compute_loss_func` (each shard's loss must be the model's own mean to be weighted)",
            group="client_parallel"),
    # FSDP: what reads whole tensors or per-client copies that the round's shards cannot give
    Refusal(lambda s: _sharded(s) and (PERSONAL in s.sharing_roles.values() or s.sharing.preset != "all"
                                       or s.args.lora_client_ranks is not None),
            lambda s: "a `parameter_sharing` other than 'all' or `lora_client_ranks` (personal and partly trained "
                      "tensors are kept per client whole)", group="fsdp"),
    Refusal(lambda s: _sharded(s) and (s.rule.aggregator.gathers or s.needs_lora_pairs
                                       or s.rule.aggregator.folds_into_base or s.rule.aggregator.needs_preconditioners
                                       or s.rule.aggregator.freezes_lora_a or s.rule.aggregator.refactorises_lora),
            lambda s: f"`server_rule={s.rule.name!r}` (it reads whole tensors: every client's update, LoRA products "
                      "and their SVD, base weights or the clients' preconditioners to invert)", group="fsdp"),
    Refusal(lambda s: _sharded(s) and getattr(s.algorithm.local_optimizer.cls, "needs_model", False),
            lambda s: f"`local_optimizer={s.algorithm.local_optimizer.cls.__name__}` (its curvature pass runs the "
                      "full batches through the model on every process, which FSDP would sum over processes)",
            group="fsdp"),
    Refusal(lambda s: _sharded(s) and (parse_plan(s.args.uplink_compression).active
                                       or parse_plan(s.args.downlink_compression).active),
            lambda s: "`uplink_compression`/`downlink_compression` (top-k, low rank and quantiser scales read whole "
                      "tensors)", group="fsdp"),
    Refusal(lambda s: _sharded(s) and (s.args.dp_mode != "off" or s.args.secure_aggregation),
            lambda s: "`dp_mode`/`secure_aggregation` (a client's clip and noise are drawn over its whole update)",
            group="fsdp"),
    Refusal(lambda s: _sharded(s) and s.args.drift_spectral,
            lambda s: "`drift_spectral=True` (a spectral norm needs whole matrices)", group="fsdp"),
    Refusal(lambda s: _sharded(s) and any(not p.is_floating_point() for p in s.model.parameters()),
            lambda s: "a quantised base (QLoRA: bitsandbytes' integer weights keep their quantisation state outside "
                      "the tensor, which FSDP2's DTensor conversion drops; accelerate leaves them unsharded, so "
                      "sharding would not divide the base's memory)", group="fsdp"),
]

# one setting's problems in one message: (head, fix)
GROUPS: Dict[str, tuple] = {
    "batched_clients": (lambda s: f"`batched_clients={s.args.batched_clients}` cannot train clients together with ",
                        "Set `batched_clients=1` or change that setting."),
    "client_parallel": (lambda s: "`client_parallel=True` cannot run with ",
                        "Turn client_parallel off or change that setting."),
    "fsdp": (lambda s: "`fsdp` (the model sharded over the processes) cannot run with ",
             "Change that setting, or run without FSDP (unset `fsdp`; launch without an FSDP config)."),
}


def _sharded(s: Setup) -> bool:
    return sharding_requested(s.args)


def _stackable(model) -> None:
    from ...runtime.stacked_adapters import trainable_linears

    trainable_linears(model)


def check_setting_combinations(args) -> None:
    """Raise the first refusal of the rows that need the settings only (``FederatedConfig.__post_init__``)."""
    _refuse(Setup(None, args), [row for row in COMBINATIONS if row.needs == SETTINGS])


def check_combinations(trainer) -> None:
    """Raise the first refusal of the table that applies (a group's problems together, in one message), every row
    (the settings' ones again: a field may have changed since the config was made)."""
    _refuse(Setup(trainer), COMBINATIONS)


def _refuse(s: Setup, rows: List[Refusal]) -> None:
    grouped: Dict[str, List[str]] = {}
    for row in rows:
        if row.group and grouped.get(row.group) is None:
            grouped[row.group] = []
        if not row.when(s):
            continue
        if row.check is not None:
            row.check(s)
        elif row.group:
            grouped[row.group].append(row.problem(s))
        else:
            raise ValueError(row.message(s))
    for group, problems in grouped.items():
        if problems:
            head, fix = GROUPS[group]
            raise ValueError(head(s) + "; ".join(problems) + ". " + fix)
