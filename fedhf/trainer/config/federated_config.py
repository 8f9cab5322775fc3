"""FederatedConfig: ``transformers.TrainingArguments`` plus the federation (trl's SFTConfig pattern), so
``HfArgumentParser``, YAML recipes, ``report_to``, ``output_dir``, ``per_device_train_batch_size``,
``max_grad_norm``, ``bf16``, ``seed`` and the rest keep their usual meaning. The class docstring lists the
federation's parameters by group and the defaults that differ from TrainingArguments; the data split, compression
and privacy groups are bases of their own, each listing its parameters (partition_settings.py,
compression_settings.py, privacy_settings.py). The choice lists in each field's help are read from the registries,
so a new component shows up in ``--help`` with its registry line.
"""

from __future__ import annotations

import copy
import json
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from transformers import TrainingArguments

from .config_checks import (check_batch_sizes, check_federation_fields, check_hub_access, check_mixed_precision,
                            check_output_dir, coerce_numeric_strings, set_metric_direction)
from ...algorithms import ALGORITHMS, compose
from ...compression import parse_plan
from ...corrections import CORRECTIONS
from ...data.embedding_key import check_encoder
from ...optim import LOCAL_OPTIMIZERS
from ...runtime.processes import cpu_only_launch
from ...runtime.sharded import check_fsdp_launch, fsdp_settings, sharding_requested
from ...server import AGGREGATORS, SERVER_RULES, SERVER_TRANSFORMS
from ...sharing.plan import PRESETS, ParameterSharing
from ...sync import STATE_SYNCS
from .clock_settings import ClockSettings, check_clock_fields
from .combinations import check_setting_combinations
from .compression_settings import CompressionSettings
from .field_help import choice_list
from .partition_settings import PartitionSettings
from .privacy_settings import PrivacySettings, check_privacy_budget, check_privacy_fields
from .resume_fields import fingerprint_fields, settings_bases
from .settings import check_ddp_timeout, map_round_strategies, refuse_unsupported

ROUND_SCHEDULES = ("cosine", "constant")
TRAINING_ARGUMENTS_DEFAULTS = {f.name: f.default if f.default is not MISSING else f.default_factory()
                               for f in fields(TrainingArguments) if f.default is not MISSING
                               or f.default_factory is not MISSING}
CLIENT_WEIGHTINGS = ("uniform", "num_samples")
#: The fields the algorithm and the parameter sharing are built from: a later change to one of them rebuilds it.
ALGORITHM_FIELDS = ("algorithm", "algorithm_kwargs", "local_optimizer", "local_optimizer_kwargs", "correction",
                    "correction_kwargs", "server_rule", "server_rule_kwargs", "state_sync", "state_sync_kwargs",
                    "learning_rate", "weight_decay")
SHARING_FIELDS = ("parameter_sharing", "parameter_sharing_kwargs")


def _as_dict(value: Union[str, Dict[str, Any], None], name: str) -> Dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"`{name}` must be a dict or a JSON object string, got {value!r} ({err}).") from None
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(f"`{name}` must be a dict or a JSON object string such as '{{\"beta\": 0.5}}', got {value!r}.")


# The data split, compression and privacy fields are declared in their own bases (fedhf/trainer/*_settings.py):
# only defaulted fields (they follow TrainingArguments', and a field without a default cannot follow one with) and
# no methods (__post_init__ below checks them). dataclasses.fields() takes the bases' fields in reverse MRO order:
# TrainingArguments' first, then the three groups (the last base's first), then FederatedConfig's own; so --help
# and to_dict() list those groups before num_clients and algorithm. Nothing reads the fields by position.
@dataclass
class FederatedConfig(ClockSettings, PrivacySettings, CompressionSettings, PartitionSettings, TrainingArguments):
    r"""
    Configuration of :class:`fedhf.FederatedTrainer`: ``transformers.TrainingArguments`` plus the federation. Only
    the federation's parameters are listed here; every TrainingArguments field keeps its meaning, or is refused
    with the fix, or has no effect (fedhf/trainer/config/settings.py; docs/trainer_settings.md is generated from it).
    With ``HfArgumentParser`` each parameter is a command-line flag (``--num_clients 20``) or a YAML recipe key.

    Parameters:
        > The federation

        num_clients (`int`, defaults to `10`): simulated clients N.
        clients_per_round (`int`, *optional*): clients sampled per round S; defaults to all N.
        num_rounds (`int`, defaults to `10`): communication rounds R.
        local_steps (`int`, defaults to `10`): optimizer steps K per client per round.
        client_weighting (`str`, defaults to `"uniform"`): a client's weight w_i in the means.
        max_update_norm (`float`, *optional*): exclude a client whose update norm exceeds this.
        max_excluded_rounds (`int`, defaults to `3`): stop after this many rounds in a row with every client
            excluded; 0 = never.

        > The algorithm: a name, or any of its four axes replaced

        algorithm (`str`, defaults to `"fedavg"`): a named algorithm (``fedhf.algorithms.list_algorithms()``).
        algorithm_kwargs (`dict` or JSON `str`, *optional*): its keyword arguments.
        local_optimizer (`str`, *optional*): replace the named algorithm's local optimizer.
        correction (`str`, *optional*): replace its correction (the local step steered toward the global one).
        server_rule (`str`, *optional*): replace its server rule: a name, or a chain such as ``median+momentum``.
        state_sync (`str`, *optional*): replace what happens to the optimizer state between rounds.
        local_optimizer_kwargs, correction_kwargs, server_rule_kwargs, state_sync_kwargs (`dict` or JSON `str`,
            *optional*): keyword arguments of the replaced axis.
        round_lr_schedule (`str`, defaults to `"cosine"`): the learning rate over rounds (constant within one).
        learning_rate, weight_decay (`float`, *optional*): the local optimizer's; default: the algorithm's paper
            default.

        > The data split: :class:`~fedhf.trainer.config.partition_settings.PartitionSettings`

        > LoRA and parameter sharing

        parameter_sharing (`str`, defaults to `"all"`): which trainable tensors are shared, personal or frozen.
        parameter_sharing_kwargs (`dict` or JSON `str`, *optional*): name patterns overriding the preset.
        lora_client_ranks (`list[int]`, *optional*): one LoRA rank per client (heterogeneous ranks).

        > Scaling and execution

        batched_clients (`int`, defaults to `1`): clients trained at once on the one resident base.
        client_parallel (`bool`, defaults to `False`): all processes train each client together.
        logits_at_labels_only (`bool`, defaults to `True`): a causal LM's head and loss only where a label is.

        > Compression: :class:`~fedhf.trainer.config.compression_settings.CompressionSettings`

        > Evaluation

        eval_every_rounds (`int`, defaults to `1`): evaluate every N rounds and after the last.
        personalized_eval (`bool`, defaults to `False`): also evaluate each client's own model.
        drift_spectral (`bool`, defaults to `False`): also log the layer-wise spectral drift of Theta.

        > State and memory

        save_every_rounds (`int`, defaults to `0`): write a resumable checkpoint every N rounds; 0 = never.
        overwrite_output_dir (`bool`, defaults to `False`): allow a new run over an earlier one.
        client_state_budget_mb (`float`, *optional*): memory for per-client state; beyond it, spill to disk.
        client_state_dir (`str`, *optional*): where per-client state spills to.
        memory_budget_gb (`float`, *optional*): refuse to start when the memory plan exceeds this per process.

        > Privacy: :class:`~fedhf.trainer.config.privacy_settings.PrivacySettings`

        > Simulated time: :class:`~fedhf.trainer.config.clock_settings.ClockSettings`

    > [!NOTE]
    > These parameters have defaults different from TrainingArguments', on purpose:
    > - `learning_rate` and `weight_decay`: `None` instead of `5e-5` and `0.0`: the algorithm's paper defaults apply
    >   unless set (SGD-based federated algorithms want lr 0.1).
    > - `logging_steps`: `1` instead of `500`: one step of the trainer state is one round.
    > - `average_tokens_across_devices`: `False` instead of `True`: local steps never all-reduce gradients, so
    >   there is nothing to average across processes.

    Other TrainingArguments fields read the federated way: ``gradient_accumulation_steps`` G makes one local step
    one optimizer step over G micro-batches of ``per_device_train_batch_size`` rows (``FederatedTrainer._local_steps``
    for the mean it matches); ``eval_strategy="steps"``/``eval_steps`` set ``eval_every_rounds`` and
    ``save_strategy="steps"``/``save_steps`` set ``save_every_rounds``; ``max_steps``, ``num_train_epochs``,
    ``warmup_steps``, ``lr_scheduler_type`` and ``optim`` are refused (set ``num_rounds``/``local_steps``,
    ``round_lr_schedule``, ``local_optimizer``). Whenever an ``eval_dataset`` is given the global model is evaluated
    every ``eval_every_rounds`` rounds and after the last (``eval_on_start`` adds round 0).

    The algorithm and the parameter sharing are built once, when the config is made, and reused by the trainer
    (:meth:`built_algorithm`); a field they are built from, changed afterwards, rebuilds them.
    """

    # Fields in the groups above. (A TrainingArguments field re-declared here keeps its place among
    # TrainingArguments' fields in dataclasses.fields(); its group is the docstring's.)
    # --- the federation ---
    num_clients: int = field(default=10, metadata={"help": "Number of simulated clients N."})
    clients_per_round: Optional[int] = field(
        default=None, metadata={"help": "Clients sampled per round without replacement (S); default: all N."})
    num_rounds: int = field(default=10, metadata={"help": "Communication rounds R."})
    local_steps: int = field(
        default=10, metadata={"help": "Optimizer steps K per client per round; a client cycles its data as needed."})
    client_weighting: str = field(
        default="uniform",
        metadata={"help": f"Weight w_i of a client in the means, one of: {choice_list(CLIENT_WEIGHTINGS)} ('uniform': "
                          "every seed paper)."})
    max_update_norm: Optional[float] = field(
        default=None,
        metadata={"help": "Exclude a client whose update norm exceeds this (non-finite loss or update always is)."})
    max_excluded_rounds: int = field(
        default=3,
        metadata={"help": "Stop with an error when every client is excluded in this many consecutive rounds "
                          "(the model no longer changes; usually learning_rate too large); 0 = never stop."})
    # --- the algorithm: a name, or any of its four axes replaced ---
    algorithm: str = field(
        default="fedavg", metadata={"help": f"Named algorithm, one of: {choice_list(ALGORITHMS.names())}."})
    algorithm_kwargs: Optional[Union[dict, str]] = field(
        default=None, metadata={"help": "Keyword arguments of the named algorithm (dict or JSON string)."})
    local_optimizer: Optional[str] = field(
        default=None, metadata={"help": f"Replace the local optimizer: {choice_list(LOCAL_OPTIMIZERS.names())}, or any "
                                        "torch.optim class name."})
    local_optimizer_kwargs: Optional[Union[dict, str]] = field(
        default=None, metadata={"help": "Keyword arguments of the local optimizer (dict or JSON string)."})
    correction: Optional[str] = field(
        default=None, metadata={"help": f"Replace the correction: {choice_list(CORRECTIONS.names())}."})
    correction_kwargs: Optional[Union[dict, str]] = field(default=None, metadata={"help": "Correction kwargs."})
    server_rule: Optional[str] = field(
        default=None, metadata={"help": f"Replace the server rule: {choice_list(SERVER_RULES.names())}; or a chain "
                                        "'<aggregator>+<transform>+...' such as 'median+momentum', with aggregators "
                                        f"{choice_list(AGGREGATORS.names())} and transforms "
                                        f"{choice_list(SERVER_TRANSFORMS.names())}."})
    server_rule_kwargs: Optional[Union[dict, str]] = field(default=None, metadata={"help": "Server rule kwargs."})
    state_sync: Optional[str] = field(
        default=None, metadata={"help": f"Replace the optimizer-state sync: {choice_list(STATE_SYNCS.names())}."})
    state_sync_kwargs: Optional[Union[dict, str]] = field(default=None, metadata={"help": "State sync kwargs."})
    round_lr_schedule: str = field(
        default="cosine", metadata={"help": f"Learning rate over rounds, one of: {choice_list(ROUND_SCHEDULES)} "
                                            "('cosine': to 0, the papers')."})
    learning_rate: Optional[float] = field(
        default=None, metadata={"help": "Peak local learning rate; default: the algorithm's paper default."})
    weight_decay: Optional[float] = field(
        default=None, metadata={"help": "Local weight decay; default: the algorithm's paper default."})
    # --- LoRA and parameter sharing ---
    parameter_sharing: str = field(
        default="all", metadata={"help": "Which trainable tensors are shared, personal (kept per client) or frozen, "
                                         f"a preset: {choice_list(PRESETS)} (fedsa: LoRA B personal; ffa: LoRA A "
                                         "frozen at a seeded init; rolora: LoRA A and B trained in alternate rounds; "
                                         "fedhf/sharing/plan.py)."})
    parameter_sharing_kwargs: Optional[Union[dict, str]] = field(
        default=None, metadata={"help": 'Name patterns (regular expressions) overriding the preset: '
                                        '{"personal": [...], "frozen": [...], "shared": [...]}.'})
    lora_client_ranks: Optional[List[int]] = field(
        default=None,
        metadata={"help": "Heterogeneous LoRA ranks, one per client: client i trains the first r_i rank components of "
                          "the global adapter (the rest zeroed). Needs a product rule (flexlora, flora, fedex_lora, "
                          "fedsvd); see fedhf/sharing/client_ranks.py."})
    # --- scaling and execution ---
    batched_clients: int = field(
        default=1,
        metadata={"help": "Train this many of a round's clients at once: their adapters stacked on the one resident "
                          "base, one forward/backward over their concatenated batches, each client its own "
                          "gradient, optimizer and correction (fedhf/runtime/stacked_adapters.py). 1 = one at a time."})
    client_parallel: bool = field(
        default=False,
        metadata={"help": "With several processes: all of them train each sampled client together, its batches split "
                          "across processes and the gradients all-reduced per step (fedhf/trainer/runners/client_parallel.py), "
                          "instead of spreading the clients over the processes."})
    logits_at_labels_only: bool = field(
        default=True,
        metadata={"help": "A causal LM computes its vocabulary projection and loss only at the positions whose next "
                          "token has a label (fedhf/runtime/labelled_logits.py): the same loss and gradients, far "
                          "fewer logits in SFT. False: every position's logits (a compute_loss override that reads "
                          "them). FederatedSFTTrainer and client_parallel keep them all (trl's token metrics "
                          "read every logit; client-parallel agreement with one process is checked with every "
                          "position)."})
    average_tokens_across_devices: bool = field(
        default=False,
        metadata={"help": "Kept off: local steps never all-reduce gradients, so there is nothing to average across "
                          "processes (Trainer's default True scales eval_loss by the number of processes)."})
    # --- evaluation ---
    eval_every_rounds: int = field(
        default=1, metadata={"help": "Evaluate every N rounds (and after the last); 0 = only after the last."})
    personalized_eval: bool = field(
        default=False,
        metadata={"help": "At every evaluated round, also evaluate each client's own model (global + its personal "
                          "tensors) on its held-out rows (needs client_eval_fraction > 0) and log the mean, the "
                          "worst client and the std over clients as personal_eval_* (fedhf/trainer/hooks/personal_eval.py)."})
    drift_spectral: bool = field(
        default=False,
        metadata={"help": "Also log FedPAC's layer-wise spectral drift mean_i ||Theta_i - Thetabar||_2 per Theta "
                          "tensor (precond_drift_spectral*). Costs one matrix 2-norm per tensor and client, and "
                          "keeps the round's Theta_i in memory until the round's sums are in."})
    logging_steps: float = field(
        default=1, metadata={"help": "Log every N rounds (with logging_strategy='steps'); one step is one round."})
    # --- state and memory ---
    save_every_rounds: int = field(
        default=0,
        metadata={"help": "Every N rounds write output_dir/checkpoint-N (the run's full state, to resume "
                          "with train(resume_from_checkpoint=...), and the global model under model/); 0 = never."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Allow a new run in an output_dir that holds an earlier federated run (its history is "
                          "replaced, same-numbered checkpoints are rewritten). Off by default so nothing saved is "
                          "lost silently."})
    client_state_budget_mb: Optional[float] = field(
        default=None,
        metadata={"help": "Memory for per-client state (SCAFFOLD c_i, ...), on the model's device (GPU memory when "
                          "training on a GPU); beyond it, least recently used clients go to `client_state_dir` as "
                          "safetensors. Default: unlimited."})
    client_state_dir: Optional[str] = field(
        default=None, metadata={"help": "Where per-client state spills to; default: output_dir/client_state."})
    memory_budget_gb: Optional[float] = field(
        default=None,
        metadata={"help": "Refuse to start (before any training or file write) when the memory plan printed at the "
                          "start of train() exceeds this many GiB per process (fedhf/trainer/runners/memory_plan.py). "
                          "None = no check."})

    def __post_init__(self) -> None:
        if cpu_only_launch() and not self.use_cpu:
            # Without use_cpu, accelerate reports one process under torchrun/accelerate launch on a machine with
            # no GPU while torch.distributed holds them all: every process would train every client
            # (fedhf/runtime/processes.py). On such a machine CPU is the only device anyway.
            self.use_cpu = True
        if (self.bf16 or self.bf16_full_eval) and not self.use_cpu and not torch.accelerator.is_available():
            # CPU is the only device, and bf16 autocast runs there, but transformers refuses bf16 without use_cpu:
            # a recipe with `bf16: true` would otherwise not load on a CPU-only machine.
            self.use_cpu = True
        if self.dataloader_pin_memory and not torch.accelerator.is_available():
            # Pinned memory serves copies to an accelerator; without one torch ignores the flag and warns on every
            # evaluation loader (TrainingArguments turns it off only under use_cpu). Same results either way.
            self.dataloader_pin_memory = False
        coerce_numeric_strings(self)  # before TrainingArguments compares them with numbers
        check_output_dir(self.output_dir)
        refuse_unsupported(self, TRAINING_ARGUMENTS_DEFAULTS)  # fedhf/trainer/config/settings.py: docs/trainer_settings.md
        map_round_strategies(self)
        set_metric_direction(self)  # fedhf's table, not TrainingArguments' "not a loss: higher" guess
        super().__post_init__()
        if self.fsdp_config and not self.fsdp:
            raise ValueError("`fsdp_config` is read only with `fsdp`: set `fsdp=True` to shard the model, or unset "
                             "fsdp_config.")
        if sharding_requested(self):  # FSDP2: one model over the processes, which train every client together
            fsdp_settings(self)  # refuses what the round loop cannot honour, naming the fix
            check_fsdp_launch(self)  # fedhf's fix, before Trainer's own refusal of `fsdp` without a launch
            self.client_parallel = True
        check_batch_sizes(self)
        check_mixed_precision(self)
        check_ddp_timeout(self)  # after use_cpu is settled above
        check_hub_access(self)  # before Trainer creates the Hub repository
        for name in ("algorithm_kwargs", "local_optimizer_kwargs", "correction_kwargs", "server_rule_kwargs",
                     "state_sync_kwargs", "parameter_sharing_kwargs"):
            setattr(self, name, _as_dict(getattr(self, name), name))
        if self.clients_per_round is None:
            self.clients_per_round = self.num_clients
        check_federation_fields(self, CLIENT_WEIGHTINGS, ROUND_SCHEDULES)
        check_privacy_fields(self)
        check_clock_fields(self)
        check_setting_combinations(self)  # the refusal table's rows that need the settings only
        check_privacy_budget(self)
        if self.partition_encoder is not None:
            check_encoder(self.partition_encoder)  # a local folder, before any work
        # Fails here, before any model or data is touched, on an unknown name or a bad keyword; the trainer reuses
        # what is built here (built_algorithm, built_sharing).
        self.built_algorithm()
        self.built_sharing()
        parse_plan(self.uplink_compression, "uplink_compression")  # a bad spec fails here, before any work
        parse_plan(self.downlink_compression, "downlink_compression")

    def built_algorithm(self):
        """The algorithm of these settings, built once: the same object until a field it is built from
        (``ALGORITHM_FIELDS``) changes, then built again from the new values."""
        return self._built_once("algorithm", ALGORITHM_FIELDS, self.build_algorithm)

    def built_sharing(self) -> ParameterSharing:
        """The parameter sharing of these settings, built once (as :meth:`built_algorithm`; ``SHARING_FIELDS``)."""
        return self._built_once("sharing", SHARING_FIELDS, self.build_sharing)

    def _built_once(self, what: str, names: Tuple[str, ...], build):
        # A copy of the inputs, so that a kwargs dict changed in place counts as a change too. Kept outside the
        # dataclass fields: to_dict(), to_json_string(), equality and HfArgumentParser see the settings only.
        inputs = copy.deepcopy([getattr(self, n) for n in names])
        built = self.__dict__.setdefault("_built", {})
        if what not in built or built[what][0] != inputs:
            built[what] = (inputs, build())
        return built[what][1]

    def __getstate__(self) -> dict:
        # A pickle of the config (Trainer's training_args.bin) holds the settings alone, as before; a copy builds
        # its own algorithm when asked. No credential is pickled: every *_token field (hub_token) is None there.
        return {k: (None if k.endswith("_token") else v) for k, v in self.__dict__.items() if k != "_built"}

    def build_algorithm(self):
        """A new algorithm from these settings (:meth:`built_algorithm` reuses one)."""
        return compose(
            self.algorithm, self.algorithm_kwargs,
            local_optimizer=self.local_optimizer, local_optimizer_kwargs=self.local_optimizer_kwargs,
            correction=self.correction, correction_kwargs=self.correction_kwargs,
            server_rule=self.server_rule, server_rule_kwargs=self.server_rule_kwargs,
            state_sync=self.state_sync, state_sync_kwargs=self.state_sync_kwargs,
            learning_rate=self.learning_rate, weight_decay=self.weight_decay,
        )

    @classmethod
    def settings_bases(cls) -> List[type]:
        """The settings groups this config is composed of (the ``*_settings`` bases), in declaration order."""
        return settings_bases(cls)

    def fingerprint_fields(self) -> Tuple[str, ...]:
        """The fields a round checkpoint's fingerprint holds: a resumed run must match them (resume_fields.py)."""
        return fingerprint_fields(type(self))

    def build_sharing(self) -> ParameterSharing:
        """A new parameter sharing from these settings (:meth:`built_sharing` reuses one)."""
        return ParameterSharing.from_config(self.parameter_sharing, self.parameter_sharing_kwargs)
