"""Every feature of fedhf, declared once as a small settings change on the tiny reference run (:mod:`.reference`).

The list is generated: each entry of a registry (:func:`registries`: algorithms, server rules, corrections, local
optimizers, state syncs, compressors, round policies, DP modes, parameter-sharing presets, client samplings and
weightings, round schedules, the matrix's round hooks) must have a declaration in :data:`DECLARED`, and each switch
that is no registry's entry (runners, resume, spill, dropout, ...) is declared in :data:`SWITCHES`;
:func:`undeclared` names what lacks one (tests/interactions/test_declarations.py fails on it), so a new feature
cannot land without saying how it is checked. A declaration says which oracle its pairs get:

* ``twin``: the feature is neutral, its run equals the run without it (or the initial model) to a tolerance the
  docs state; a pair with it is compared with the partner alone.
* ``statistical``: a property its runs must have (dropout masks independent across steps, clients and shards;
  FedBuff's report times on identical devices); ``first`` puts it before any twin (dropout changes the random
  stream, so no twin holds), otherwise it applies where no twin does.
* neither: its pairs train (finite loss, the model moves, no crash) unless the partner has a twin or a property.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

REFERENCE = "reference"  # a registry entry that is the reference run's own value (no feature of its own)
PROCESS_TOLERANCE = (1e-5, 5e-6, "docs/scaling.md: 2 processes give the 1-process model to 1e-5 relative + 5e-6")
CURVATURE_PROCESSES = (0.0, 3e-3, "docs/scaling.md: Muon's and SOAP's steps amplify the last bits of a split batch, "
                                  "up to 2.7e-3 with or without FSDP")
HISTORY_KEYS = ("train_loss", "participants", "eval_loss", "update_norm_median", "update_norm_max", "uplink_MB",
                "downlink_MB", "sim_round_s", "sim_time_s")


@dataclass(frozen=True)
class Twin:
    """The neutral twin: the run without the feature (``initial``: the model before training) equals the feature's
    run to ``atol`` + ``rtol`` |twin| per entry, tensors and the shared history keys; ``partners`` overrides that for
    some partners (None: no twin holds with that partner)."""

    rtol: float
    atol: float
    source: str
    initial: bool = False
    partners: Mapping[str, Optional[Tuple[float, float, str]]] = field(default_factory=dict)
    wire: bool = False  # it changes what is sent (encodings), so the byte counts are not compared

    def tolerance(self, partner: str) -> Optional[Tuple[float, float, str]]:
        return self.partners[partner] if partner in self.partners else (self.rtol, self.atol, self.source)


@dataclass(frozen=True)
class Feature:
    name: str
    axis: str  # features of one axis are alternatives, never a pair
    settings: Mapping = field(default_factory=dict)  # FederatedConfig fields
    hooks: Tuple[str, ...] = ()  # round hooks (fedhf/interactions/hooks.py)
    data: Mapping = field(default_factory=dict)  # reference data overrides (rows, lo, hi)
    model: Mapping = field(default_factory=dict)  # reference model overrides (lora_dropout)
    processes: int = 1  # 2: run under torchrun
    resume: bool = False
    twin: Optional[Twin] = None
    statistical: Optional[str] = None  # a property in oracles.PROPERTIES
    first: bool = False  # the property comes before any twin
    alone: bool = False  # checked alone only (an algorithm: a preset of the paired component axes)
    note: str = ""

    def spec(self) -> dict:
        return {"settings": dict(self.settings), "hooks": self.hooks, "data": dict(self.data),
                "model": dict(self.model), "resume": self.resume, "masks": self.statistical == "dropout_masks"}


def _twin(rtol, atol, source, initial=False, partners=None, wire=False, **feature):
    return {"twin": Twin(rtol, atol, source, initial, partners or {}, wire), **feature}


EXACT = (0.0, 0.0)
MUON = ("local_optimizer:muon", "local_optimizer:soap", "newton_schulz:pool", "state_sync:compressed_average",
        "state_sync:average_warmstart", "state_sync:persist_local")
ADAPTIVE_PROCESSES = (1e-5, 5e-5, "docs/scaling.md: an Adam-type step divides by sqrt(v), so the last bits of a "
                                  "split batch's gradient move it by up to 5e-5")
SOAP_SPLIT = None  # docs/scaling.md: SOAP's eigenbasis of a rank-deficient factor turns them into O(lr): no tolerance
_PROCESS_PARTNERS = {m: CURVATURE_PROCESSES for m in MUON}
_PROCESS_PARTNERS.update({"dropout:on": None, "local_optimizer:soap": SOAP_SPLIT})
_PROCESS_PARTNERS.update({f"local_optimizer:{n}": ADAPTIVE_PROCESSES for n in ("adamw", "amsgrad", "sophia")})
_PROCESS_PARTNERS["state_sync:desloc"] = ADAPTIVE_PROCESSES  # its local optimizer is AdamW
# the codec's rounding bound holds for a linear step: adaptive and orthogonalised steps, and rules that re-factorise
# LoRA by an SVD, amplify it, so no twin is claimed with those
_NO_TWIN_WITH_MUON = {m: None for m in MUON + (
    "local_optimizer:adamw", "local_optimizer:amsgrad", "local_optimizer:sophia", "local_optimizer:covariance_adam",
    "server_rule:fedsvd", "server_rule:flexlora", "server_rule:flora", "lora_client_ranks:on")}

# the registries' entries: name -> REFERENCE or the declaration's keywords (settings are the axis field = name
# unless given)
DECLARED: Dict[str, Dict[str, object]] = {
    "algorithm": {name: REFERENCE if name == "fedavg" else {"alone": True} for name in (
        "desloc", "diloco", "fadam_et", "fadam_gt", "fed_sophia", "fedadagrad", "fedadam", "fedavg", "fedavgm", "fedcm",
        "fedlada", "fedmuon", "fedmuon_svd", "fedpac_muon", "fedpac_muon_light", "fedpac_soap", "fedpac_soap_light",
        "fedpac_sophia", "fedpac_sophia_light", "fedpm", "fedprox", "fedyogi", "local_adamw", "local_muon",
        "local_soap", "local_sophia", "localnewton", "muloco", "prefed", "prefedopt", "scaffold")},
    "server_rule": {"mean": REFERENCE, **{n: {} for n in (
        "adagrad", "adam", "fedex_lora", "fedsvd", "flexlora", "flora", "median", "momentum", "prefedopt",
        "trimmed_mean", "yogi")},
        "preconditioned_mix": {"settings": {"server_rule": "preconditioned_mix", "local_optimizer": "foof",
                                            "state_sync": "persist_local"}}},
    "correction": {"none": REFERENCE, **{n: {} for n in (
        "control_variate", "control_variate_post", "global_mix", "gradient_tracking", "proximal")}},
    "local_optimizer": {"sgd": REFERENCE, **{n: {} for n in (
        "adamw", "amsgrad", "covariance_adam", "foof", "muon", "soap", "sophia")}},
    "state_sync": {"reset": REFERENCE, **{n: {"settings": {"state_sync": n, "local_optimizer": "muon"}} for n in (
        "average_warmstart", "compressed_average", "persist_local")},
        "desloc": {"settings": {"state_sync": "desloc", "local_optimizer": "adamw"}}},  # Adam's moments only
    "uplink_compression": {"none": REFERENCE, "topk": _twin(0.0, 1e-7, "a top-k of every entry (topk:1.0) sends "
                                                                       "the change as it is", wire=True, settings={
        "uplink_compression": "topk:1.0"}), **{n: {} for n in ("bf16", "fp16", "int8", "int4", "int2", "powersgd")}},
    "round_policy": {
        "wait_all": _twin(*EXACT, "docs/clock.md: with clock_profile='uniform' and availability 1 a run is the "
                                  "clock-free run bit for bit", settings={"clock_profile": "uniform"}),
        "deadline": {"settings": {"clock_profile": "lognormal", "round_policy": "deadline", "round_deadline_s": 3.0}},
        "fedbuff": {"settings": {"clock_profile": "uniform", "round_policy": "fedbuff", "clients_per_round": 2,
                                 "async_concurrency": 4, "num_rounds": 4}, "data": {"lo": 8, "hi": 8},
                    "statistical": "fedbuff_times"}},
    "dp_mode": {"off": REFERENCE,
                "central": _twin(0.0, 1e-6, "DP with noise 0 and a clip that never binds is the run without DP "
                                            "(the sum is divided once, not per client: float rounding)",
                                 # DP divides by the expected cohort; under DP the clock counts every client's
                                 # rows at the training set's mean length (docs/privacy.md), so a deadline keeps
                                 # other clients than the twin's
                                 partners={"client_sampling:poisson": None, "round_policy:deadline": None},
                                 settings={"dp_mode": "central", "dp_noise_multiplier": 0.0, "dp_clip_norm": 1e6,
                                           "dp_reproducible_noise": True}),
                "distributed": _twin(0.0, 1.5e-5, "distributed DP with noise 0 and a clip that never binds (C = "
                                                  "1000) is secure aggregation on [-C, C] at 28 bits: each round's "
                                                  "mean moves by at most one step 2C / 2^28 = 7.5e-6", wire=True,
                                     partners=_NO_TWIN_WITH_MUON,
                                     settings={"dp_mode": "distributed", "secure_aggregation": True,
                                               "dp_noise_multiplier": 0.0, "dp_clip_norm": 1000.0, "secagg_bits": 28,
                                               "dp_reproducible_noise": True})},
    "parameter_sharing": {"all": REFERENCE, **{n: {} for n in (
        "fedsa", "ffa", "personal_head", "personal_norm", "rolora")}},
    "client_sampling": {"fixed": REFERENCE, "poisson": {}},
    "client_weighting": {"uniform": REFERENCE, "num_samples": _twin(
        0.0, 1e-6, "clients of equal size weigh the same by their rows (float rounding of the weights)",
        partners={"short_tail:on": None, "hook:update_norms": None})},  # a hook sees the weighted messages
    "round_lr_schedule": {"cosine": REFERENCE, "constant": {}},
    "hook": {"identity": _twin(*EXACT, "docs/round_hooks.md: a hook that returns the messages as they came changes "
                                       "nothing"),
             "zero_change": _twin(*EXACT, "docs/round_hooks.md: what on_client_message returns is what the server "
                                          "aggregates; a zero change leaves the model where it started",
                                  initial=True, partners={  # rules that re-factorise B A; personal B trains locally
                                      "server_rule:fedsvd": None, "server_rule:flexlora": None,
                                      "server_rule:flora": None, "parameter_sharing:fedsa": None,
                                      "lora_client_ranks:on": None}),
             "update_norms": _twin(*EXACT, "docs/round_hooks.md: the example hook only reads the messages")},
}

# switches that are no registry's entry: name -> declaration keywords (axis "runner" holds the launch modes)
SWITCHES: Dict[str, Dict[str, object]] = {
    "runner:spread": dict(processes=2, **_twin(0.0, 0.0, "docs/scaling.md: 1 and 2 processes give the same global "
                                                          "model, bit for bit, at one thread each")),
    "runner:client_parallel": dict(processes=2, settings={"client_parallel": True},
                                   **_twin(*PROCESS_TOLERANCE[:2], PROCESS_TOLERANCE[2], partners=_PROCESS_PARTNERS)),
    "runner:fsdp": dict(processes=2, settings={"fsdp": True},
                        **_twin(*PROCESS_TOLERANCE[:2], PROCESS_TOLERANCE[2], partners=_PROCESS_PARTNERS)),
    "runner:batched": dict(settings={"batched_clients": 3}, **_twin(
        0.0, 2e-5, "docs/scaling.md: batched clients equal one-at-a-time training to 2e-5",
        partners={**{m: (0.0, 2e-3, "docs/scaling.md: Muon with batches padded per batch is within 2e-3 of "
                                    "one-at-a-time training") for m in MUON},
                  "newton_schulz:pool": (0.0, 1e-3, "docs/scaling.md: the Newton-Schulz pool is within 1e-3 of "
                                                    "sequential clients with bfloat16 matmuls (bit for bit with "
                                                    "float32-accumulated products)"),
                  "local_optimizer:soap": SOAP_SPLIT, "dropout:on": None})),
    "resume:on": dict(resume=True, **_twin(*EXACT, "docs/scaling.md: a resumed run ends with the uninterrupted "
                                                   "model bit for bit")),
    "spill:on": dict(settings={"client_state_budget_mb": 1e-6}, **_twin(
        *EXACT, "docs/compression.md: per-client state spilled to disk comes back bit for bit")),
    "evaluate:on": dict(settings={"eval_every_rounds": 1}, **_twin(*EXACT, "evaluating the global model changes no "
                                                                           "training")),
    "secure_aggregation:on": dict(settings={"secure_aggregation": True, "secagg_bits": 28, "secagg_range": 1000.0},
                                  **_twin(0.0, 1.5e-5, "docs/privacy.md: the unmasked sum equals the quantised "
                                                       "plaintext sum exactly; at 28 bits on [-1000, 1000] each "
                                                       "round's mean moves by at most one step 7.5e-6", wire=True,
                                          partners=_NO_TWIN_WITH_MUON)),
    "dropout:on": dict(model={"lora_dropout": 0.5}, statistical="dropout_masks", first=True),
    "short_tail:on": dict(data={"rows": 21}, note="clients of 5-6 rows at batch 4: a 1-row last micro-batch"),
    "newton_schulz:pool": dict(axis="local_optimizer", settings={"local_optimizer": "muon",
                                         "local_optimizer_kwargs": {"newton_schulz": "batched"}}),
    "downlink_compression:int8": dict(settings={"downlink_compression": "int8"}),
    "error_feedback:on": dict(axis="uplink_compression",
                              settings={"uplink_compression": "int8", "error_feedback": True}),
    "lora_client_ranks:on": dict(settings={"lora_client_ranks": [2, 4, 4, 2], "server_rule": "flexlora"}),
    "personalized_eval:on": dict(settings={"personalized_eval": True, "client_eval_fraction": 0.25}),
    "max_update_norm:on": dict(settings={"max_update_norm": 1e6}, **_twin(
        *EXACT, "an update-norm bound no client reaches excludes nobody")),
    "logits_at_labels_only:off": dict(settings={"logits_at_labels_only": False}, **_twin(
        0.0, 1e-6, "docs/scaling.md: the labelled-position head equals the full head (float rounding)")),
    "fsdp_config:unknown": dict(processes=2, alone=True, settings={"fsdp": True, "fsdp_config": {
        "auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 1000000}},
        note="docs/trainer_settings.md: other fsdp_config keys are refused"),
    "fsdp:one_process": dict(alone=True, settings={"fsdp": True},
                             note="fsdp on one process: refused by fedhf with its fix"),
}
MUST_REFUSE = ("fsdp_config:unknown", "fsdp:one_process")  # declared refusals (alone)


def registries() -> Dict[str, List[str]]:
    """Each registry's entries, read from the registries themselves."""
    from ..algorithms.compose import ALGORITHMS
    from ..compression.base import COMPRESSORS
    from ..corrections import CORRECTIONS
    from ..optim import LOCAL_OPTIMIZERS
    from ..privacy import SAMPLINGS
    from ..server import SERVER_RULES
    from ..sharing.plan import PRESETS
    from ..sync import STATE_SYNCS
    from ..trainer.config.clock_settings import ROUND_POLICIES
    from ..trainer.config.federated_config import CLIENT_WEIGHTINGS, ROUND_SCHEDULES
    from ..trainer.config.privacy_settings import DP_MODES
    from .hooks import HOOKS

    return {"algorithm": ALGORITHMS.names(), "server_rule": SERVER_RULES.names(), "correction": CORRECTIONS.names(),
            "local_optimizer": LOCAL_OPTIMIZERS.names(), "state_sync": STATE_SYNCS.names(),
            "uplink_compression": COMPRESSORS.names(), "round_policy": list(ROUND_POLICIES),
            "dp_mode": list(DP_MODES), "parameter_sharing": sorted(PRESETS), "client_sampling": list(SAMPLINGS),
            "client_weighting": list(CLIENT_WEIGHTINGS), "round_lr_schedule": list(ROUND_SCHEDULES),
            "hook": sorted(HOOKS)}


def undeclared() -> List[str]:
    """Registry entries without a declaration, and declarations of entries no registry has."""
    found = registries()
    missing = [f"{axis}:{n}" for axis, names in found.items() for n in names if n not in DECLARED.get(axis, {})]
    stale = [f"{axis}:{n}" for axis, names in DECLARED.items() for n in names if n not in found.get(axis, ())]
    return missing + [f"{s} (declared, not registered)" for s in stale]


def features() -> List[Feature]:
    """Every declared feature (registry entries in registry order, then the switches); references excluded."""
    out = []
    for axis, names in registries().items():
        for name in names:
            declared = DECLARED.get(axis, {}).get(name)
            if declared is None or declared == REFERENCE:
                continue
            kw = dict(declared)
            settings = kw.pop("settings", None)
            if settings is None:
                settings = {} if axis == "hook" else {axis: name}
            hooks = (name,) if axis == "hook" else ()
            out.append(Feature(f"{axis}:{name}", axis, settings, hooks, **kw))
    for name, kw in SWITCHES.items():
        kw = dict(kw)
        out.append(Feature(name, kw.pop("axis", name.split(":")[0]), **kw))
    return out


# FederatedConfig fields that are not features of their own: what each one parameterises (a feature, the reference
# run, or the data split), so that a new field needs a decision too (tests/interactions/test_declarations.py)
PARAMETERS: Dict[str, str] = {
    **{f: "the data split (the reference run's iid split)" for f in (
        "partition", "partition_column", "dirichlet_alpha", "min_partition_size", "partition_max_retries",
        "partition_key", "partition_key_buckets", "partition_encoder", "quantity_skew", "partition_report")},
    **{f: "the reference run's size" for f in ("num_clients", "num_rounds", "local_steps", "memory_budget_gb")},
    **{f: "dp_mode (its noise and accounting)" for f in (
        "dp_epsilon", "dp_delta", "dp_accountant", "dp_stop_at_budget", "dp_adaptive_clip_quantile",
        "dp_adaptive_clip_lr", "dp_adaptive_clip_count_std", "dp_min_survivors")},
    **{f: "secure_aggregation (its codec)" for f in ("secagg_bits", "secagg_range")},
    **{f: "round_policy (the simulated devices and their schedule)" for f in (
        "clock_tokens_per_s", "clock_uplink_mbps", "clock_downlink_mbps", "clock_spread", "clock_availability",
        "over_selection", "clock_budget_s")},
    **{f: "the component it configures" for f in (
        "algorithm_kwargs", "correction_kwargs", "server_rule_kwargs", "state_sync_kwargs",
        "parameter_sharing_kwargs")},
    "max_excluded_rounds": "max_update_norm (how many rounds may exclude every client)",
    "drift_spectral": "a diagnostic (the drift metric's spectral norm), refused under FSDP by the table",
    "save_every_rounds": "resume (its checkpoints)",
    "overwrite_output_dir": "the reference run (its output folder)",
    "client_state_dir": "spill (where spilled client state goes)",
}


def covered_fields() -> set:
    return {k for f in features() for k in f.settings} | set(PARAMETERS) | {
        "algorithm", "server_rule", "correction", "local_optimizer", "state_sync", "uplink_compression",
        "round_policy", "dp_mode", "parameter_sharing", "client_sampling", "client_weighting", "round_lr_schedule"}


# The correctness review's 13 findings (FSDP2, batched clients, the clock, round hooks, the refusal table) and
# the pairs (or features alone) of the matrix that catch them
FINDINGS: Dict[int, Tuple[str, Tuple[Tuple[str, ...], ...]]] = {
    1: ("low-rank state sync under FSDP factorises shards", (("state_sync:compressed_average", "runner:fsdp"),)),
    2: ("batched clients repeat the dropout mask every step", (("runner:batched", "dropout:on"),)),
    3: ("FSDP crashes on a client's 1-row last micro-batch", (("runner:fsdp", "short_tail:on"),)),
    4: ("the clock times round 1 with the shard size under FSDP", (("round_policy:deadline", "runner:fsdp"),)),
    5: ("FedBuff over-estimates the download after round 1", (("server_rule:adam", "round_policy:fedbuff"),)),
    6: ("row shards share dropout masks", (("runner:client_parallel", "dropout:on"), ("runner:fsdp", "dropout:on"))),
    7: ("robust rules ignore what a round hook sends", (("server_rule:median", "hook:zero_change"),
                                                       ("server_rule:trimmed_mean", "hook:zero_change"))),
    8: ("the example hook's metric under several processes", (("hook:update_norms", "runner:spread"),
                                                              ("hook:update_norms", "runner:fsdp"))),
    9: ("fsdp_config keys accepted and ignored", (("fsdp_config:unknown",),)),
    10: ("the Newton-Schulz pool is not bit-equal on bfloat16 hardware", (("runner:batched", "newton_schulz:pool"),)),
    11: ("batched Muon with per-batch padding beyond the documented 2e-5", (("local_optimizer:muon",
                                                                            "runner:batched"),)),
    12: ("eval_loss depends on the number of processes", (("runner:spread", "evaluate:on"),
                                                          ("runner:fsdp", "evaluate:on"))),
    13: ("fsdp on one process is refused by Trainer, not fedhf", (("fsdp:one_process",),)),
}
