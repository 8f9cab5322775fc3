"""The federated round loop on top of trl's ``SFTTrainer``: people who fine-tune with ``SFTTrainer``/``SFTConfig``
keep their tool (prompt/completion and chat ``messages`` data, chat templates, ``completion_only_loss``,
``assistant_only_loss``, ``packing``, ``peft_config``, trl's loss and token metrics) and get N simulated clients.

One round loop for every Trainer subclass, by cooperative multiple inheritance, not a copy of the loop::

    FederatedSFTTrainer -> FederatedTrainer -> SFTTrainer -> Trainer
    FederatedSFTConfig  -> FederatedConfig  -> SFTConfig  -> TrainingArguments

(abbreviated: FederatedTrainer's base LabelledPositionsLoss and FederatedConfig's settings bases, which declare only
fields, sit before SFTTrainer / SFTConfig in the order Python resolves methods).

``FederatedTrainer.train`` (the rounds) and its checkpoints come first; trl's ``__init__`` (dataset preparation,
collator, peft), ``compute_loss``, ``training_step``, ``evaluate`` and ``log`` run inside the rounds. The defaults
fedhf sets on purpose take fedhf's meaning (``learning_rate`` and ``weight_decay`` default to the algorithm's paper
values, ``logging_steps`` counts rounds, ``average_tokens_across_devices`` stays off as local steps never
all-reduce, ``save_strategy`` maps onto ``save_every_rounds``); every other SFTConfig field
keeps trl's default (``bf16`` unless ``fp16``, gradient checkpointing on (set as ``activation_checkpointing``,
transformers' current name), ``max_length`` 1024). On a machine
without a GPU, trl's ``bf16`` default sets ``use_cpu`` as an explicit ``bf16=True`` does in FederatedConfig.

trl logs token metrics (``entropy``, ``mean_token_accuracy``, ``num_tokens``) from ``compute_loss`` by gathering
them over the processes. Under several processes each process trains its own clients for its own number of steps,
so while a client trains these gathers stay in the process (they only feed the log, which then shows the logging
process's clients); evaluation runs the same batches on every process and gathers as in trl.

The split is made after trl prepares the data. trl tokenises with ``Dataset.map`` and drops only rows that
truncation leaves without a loss token, so without packing the rows keep their order and their other columns,
including ``partition_column`` (e.g. a category column for a Dirichlet split). Packing concatenates rows of
different clients' data into one sequence, so a split by a column is meaningless afterwards: packing is refused
with ``partition='dirichlet'``/``'natural'`` (use ``partition='iid'``, or split the data yourself and give each
client's rows as ``client_partitions`` without packing).

trl is an optional dependency (``pip install trl`` or ``pip install 'fedhf[llm]'``); ``import fedhf`` never needs it.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass

from transformers import TrainingArguments

try:
    from trl import SFTConfig, SFTTrainer
    from trl.trainer import utils as trl_utils
except ImportError as err:  # pragma: no cover - exercised only where trl is missing
    raise ImportError("fedhf's FederatedSFTTrainer runs on trl's SFTTrainer, which is not installed: "
                      "pip install trl  (or pip install 'fedhf[llm]').") from err

from ..runtime.library_notices import quiet_peft_wrap
from .config.federated_config import FederatedConfig
from .federated_trainer import FederatedTrainer

LABEL_SPLITS = ("dirichlet", "natural")

#: trl's defaults set through a name transformers 5 deprecated: FederatedSFTConfig sets the current name instead
#: (in __post_init__, when the user set neither), since a default under the old name warns "`gradient_checkpointing`
#: is deprecated" on every config although the user never typed it. A user who types the old name still gets it.
DEPRECATED_ALIASES = {"gradient_checkpointing": "activation_checkpointing"}


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _trl_overrides() -> list:
    """The TrainingArguments fields whose default trl's SFTConfig changes and FederatedConfig does not.

    FederatedConfig is a dataclass over TrainingArguments, so it re-declares every TrainingArguments field with
    TrainingArguments' default, and a dataclass takes the first base's copy: without re-declaring these, the
    combined config would silently take TrainingArguments' defaults over trl's (e.g. bf16 and gradient
    checkpointing off)."""
    base, fed = TrainingArguments.__dataclass_fields__, FederatedConfig.__dataclass_fields__
    return [name for name, f in SFTConfig.__dataclass_fields__.items()
            if name in base and _default(f) != _default(base[name]) and _default(fed[name]) == _default(base[name])
            and name not in DEPRECATED_ALIASES]



def _keep_trl_defaults(cls):
    """Re-declare :func:`_trl_overrides` on ``cls`` (before ``@dataclass`` reads it) as SFTConfig declares them."""
    annotations = dict(cls.__dict__.get("__annotations__", {}))
    for name in _trl_overrides():
        f = SFTConfig.__dataclass_fields__[name]
        annotations[name] = f.type
        setattr(cls, name, dataclasses.field(default=f.default, default_factory=f.default_factory,
                                             metadata=f.metadata))
    cls.__annotations__ = annotations
    return cls


@dataclass
@_keep_trl_defaults
class FederatedSFTConfig(FederatedConfig, SFTConfig):
    """trl's ``SFTConfig`` plus the federation (see :class:`fedhf.FederatedConfig`); trl's defaults hold for every
    field fedhf does not set on purpose."""

    def __post_init__(self) -> None:
        if self.bf16 is None:
            # trl's rule (its base config's __post_init__, which runs later), resolved before FederatedConfig reads
            # bf16 to pick the device, so a machine without a GPU runs it on the CPU as an explicit bf16=True does.
            self.bf16 = not self.fp16
        for old, new in DEPRECATED_ALIASES.items():
            if getattr(self, old) is None and getattr(self, new) is None:
                setattr(self, new, _default(SFTConfig.__dataclass_fields__[old]))  # trl's default, current name
        super().__post_init__()
        if self.packing and self.partition in LABEL_SPLITS:
            raise ValueError(
                f"`packing=True` merges rows into fixed-length sequences, so the `partition={self.partition!r}` split by "
                f"`partition_column={self.partition_column!r}` cannot follow them. Use `partition='iid'` with packing, "
                "or `packing=False` to split by a column.")


def _this_process(input_data, use_gather_object=False):
    return input_data  # one process's own values: what gather_for_metrics returns with one process


@contextmanager
def local_metric_gathers(accelerator):
    """``accelerator.gather_for_metrics`` keeps each process's own values inside the block (an instance attribute
    shadows the method; the method is back on exit)."""
    accelerator.gather_for_metrics = _this_process
    try:
        yield
    finally:
        del accelerator.gather_for_metrics


class FederatedSFTTrainer(FederatedTrainer, SFTTrainer):
    """``SFTTrainer`` whose ``train()`` is fedhf's federated round loop.

    Takes ``SFTTrainer``'s arguments (``processing_class``, ``peft_config``, ``formatting_func``, ...) plus
    ``client_partitions`` (row indices of ``train_dataset`` per client). Example::

        args = FederatedSFTConfig(output_dir="out", algorithm="fedpac_muon", num_clients=8, num_rounds=20,
                                  local_steps=10, partition="dirichlet", partition_column="category")
        trainer = FederatedSFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer,
                                      peft_config=LoraConfig(r=16, target_modules="all-linear"))
        trainer.train()
    """

    reads_every_logit = True  # trl's token metrics (entropy, mean_token_accuracy) read every position's logits
    #: trl >= 1.16's loss goes through its fused LM head (log-probabilities in tiles, no logits): the memory plan
    #: counts the tiles
    fused_lm_head = hasattr(trl_utils, "add_fused_lm_head")

    def __init__(self, model=None, args: FederatedSFTConfig = None, data_collator=None, train_dataset=None,
                 *trainer_args, client_partitions=None, **trainer_kwargs) -> None:
        if not isinstance(args, FederatedSFTConfig):
            raise TypeError(f"FederatedSFTTrainer needs `args=FederatedSFTConfig(...)` (trl's SFTConfig fields plus the "
                            f"federation), got {type(args).__name__}.")
        if client_partitions is not None and (args.packing or args.shuffle_dataset):
            raise ValueError("`client_partitions` index the rows of `train_dataset`, which `packing` and "
                             "`shuffle_dataset` rearrange; set both to False or let `partition` make the split.")
        with quiet_peft_wrap():  # trl wraps the model with `peft_config` (fedhf/runtime/library_notices.py)
            super().__init__(model, args, data_collator, train_dataset, *trainer_args,
                             client_partitions=client_partitions, **trainer_kwargs)
        if client_partitions is not None and len(self.train_dataset) != len(train_dataset):
            raise ValueError(
                f"trl dropped {len(train_dataset) - len(self.train_dataset)} rows of `train_dataset` (rows whose "
                f"completion is cut off by `max_length={args.max_length}`), so `client_partitions` no longer "
                "point at the rows meant; raise `max_length` or drop those rows first.")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """trl's loss. While a client trains (local steps, and the curvature estimates of second-order optimizers)
        trl's metric gathers stay in the process: processes train different clients for different numbers of
        steps, so a collective there would pair with another step's, or with the round's aggregation."""
        if not self.model.training:  # evaluation (trl's own test of the mode): the same batches everywhere
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        with local_metric_gathers(self.accelerator):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
