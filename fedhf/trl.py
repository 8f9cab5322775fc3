"""The federated round loop on top of trl's ``SFTTrainer``: people who fine-tune with ``SFTTrainer``/``SFTConfig``
keep their tool (prompt/completion and chat ``messages`` data, chat templates, ``completion_only_loss``,
``assistant_only_loss``, ``packing``, ``peft_config``, trl's loss and token metrics) and get N simulated clients.

One round loop for every Trainer subclass, by cooperative multiple inheritance, not a copy of the loop::

    FederatedSFTTrainer -> FederatedTrainer -> SFTTrainer -> Trainer
    FederatedSFTConfig  -> FederatedConfig  -> SFTConfig  -> TrainingArguments

``FederatedTrainer.train`` (the rounds) and its checkpoints come first; trl's ``__init__`` (dataset preparation,
collator, peft), ``compute_loss``, ``training_step``, ``evaluate`` and ``log`` run inside the rounds. Fields both
configs define take fedhf's meaning (``learning_rate`` and ``weight_decay`` default to the algorithm's paper
values); every other SFTConfig field keeps trl's default (``bf16`` on where supported, ``gradient_checkpointing``
on, ``max_length`` 1024).

The split is made after trl prepares the data. trl tokenises with ``Dataset.map`` and drops only rows that
truncation leaves without a loss token, so without packing the rows keep their order and their other columns,
including ``partition_column`` (e.g. a category column for a Dirichlet split). Packing concatenates rows of
different clients' data into one sequence, so a split by a column is meaningless afterwards: packing is refused
with ``partition='dirichlet'``/``'natural'`` (use ``partition='iid'``, or split the data yourself and give each
client's rows as ``client_partitions`` without packing).

trl is an optional dependency (``pip install trl`` or ``pip install 'fedhf[llm]'``); ``import fedhf`` never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

try:
    from trl import SFTConfig, SFTTrainer
except ImportError as err:  # pragma: no cover - exercised only where trl is missing
    raise ImportError("fedhf's FederatedSFTTrainer runs on trl's SFTTrainer, which is not installed: "
                      "pip install trl  (or pip install 'fedhf[llm]').") from err

from .config import FederatedConfig
from .trainer import FederatedTrainer

LABEL_SPLITS = ("dirichlet", "natural")


@dataclass
class FederatedSFTConfig(FederatedConfig, SFTConfig):
    """trl's ``SFTConfig`` plus the federation (see :class:`fedhf.FederatedConfig`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.packing and self.partition in LABEL_SPLITS:
            raise ValueError(
                f"`packing=True` merges rows into fixed-length sequences, so the `partition={self.partition!r}` split by "
                f"`partition_column={self.partition_column!r}` cannot follow them. Use `partition='iid'` with packing, "
                "or `packing=False` to split by a column.")


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

    def __init__(self, model=None, args: FederatedSFTConfig = None, data_collator=None, train_dataset=None,
                 *trainer_args, client_partitions=None, **trainer_kwargs) -> None:
        if not isinstance(args, FederatedSFTConfig):
            raise TypeError(f"FederatedSFTTrainer needs `args=FederatedSFTConfig(...)` (trl's SFTConfig fields plus the "
                            f"federation), got {type(args).__name__}.")
        if client_partitions is not None and (args.packing or args.shuffle_dataset):
            raise ValueError("`client_partitions` index the rows of `train_dataset`, which `packing` and "
                             "`shuffle_dataset` rearrange; set both to False or let `partition` make the split.")
        super().__init__(model, args, data_collator, train_dataset, *trainer_args,
                         client_partitions=client_partitions, **trainer_kwargs)
        if client_partitions is not None and len(self.train_dataset) != len(train_dataset):
            raise ValueError(
                f"trl dropped {len(train_dataset) - len(self.train_dataset)} rows of `train_dataset` (rows whose "
                f"completion is cut off by `max_length={args.max_length}`), so `client_partitions` no longer "
                "point at the rows meant; raise `max_length` or drop those rows first.")
