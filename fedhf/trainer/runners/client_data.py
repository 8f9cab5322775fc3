"""What a client reads in its round: its rows and weight, its batches (its own seeded stream) and the model access
curvature-aware optimizers get. Held by :class:`fedhf.trainer.FederatedTrainer` as ``trainer.client_data``."""

from __future__ import annotations

from typing import Iterator, List

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from ...core.context import ClientContext
from ...runtime.model_outputs import logits_of
from ...optim import ModelAccess
from ...core.schedule import stream_seed


def check_partitions(parts, num_clients: int, rows: int) -> List[np.ndarray]:
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    if len(parts) != num_clients:
        raise ValueError(f"`client_partitions` has {len(parts)} clients but `num_clients`={num_clients}.")
    for i, p in enumerate(parts):
        if len(p) == 0 or p.min() < 0 or p.max() >= rows:
            raise ValueError(f"`client_partitions[{i}]` must be a non-empty list of row indices in [0, {rows}).")
    return parts


class ClientData:
    """The clients' data of one trainer (its ``args``, ``train_dataset``, ``data_collator`` and
    ``client_partitions``); :meth:`prepare` readies the training data once at the start of ``train()``."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.train_data, self.collator = None, None

    def prepare(self) -> None:
        """Trainer's column removal, as its own loop applies it."""
        trainer = self.trainer
        data, collator = trainer.train_dataset, trainer.data_collator
        if isinstance(data, datasets.Dataset):
            data = trainer._remove_unused_columns(data, description="training")
        else:
            collator = trainer._get_collator_with_removed_columns(collator, description="training")
        self.train_data, self.collator = data, collator

    def weight(self, cid: int) -> float:
        trainer = self.trainer
        return float(len(trainer.client_partitions[cid])) if trainer.args.client_weighting == "num_samples" else 1.0

    def batches(self, cid: int, round_index: int, stream: int = 2, cycle: bool = True) -> Iterator[dict]:
        """The client's data, reshuffled per pass from its own stream and cycled for as many steps as asked."""
        args = self.trainer.args
        generator = torch.Generator().manual_seed(stream_seed(args.seed, round_index, cid, stream))
        rows, batch_size = self.trainer.client_partitions[cid].tolist(), args.per_device_train_batch_size
        # dataloader_drop_last (e.g. for BatchNorm models, which cannot train on a 1-row batch) only where the
        # client still has a full batch.
        loader = DataLoader(Subset(self.train_data, rows), batch_size=batch_size, shuffle=True, generator=generator,
                            collate_fn=self.collator, num_workers=args.dataloader_num_workers,
                            drop_last=args.dataloader_drop_last and len(rows) >= batch_size)
        yield from loader
        while cycle:
            yield from loader

    def model_access(self, ctx: ClientContext) -> ModelAccess:
        """What curvature-aware optimizers (Sophia, FOOF) may use: the model, the training loss and logits of a
        batch (under the trainer's autocast), and one fresh pass over the client's data (its own stream). The
        loss is the trainer's ``compute_loss`` (an override applies)."""
        trainer = self.trainer

        def loss(batch):
            with trainer.compute_loss_context_manager():
                return trainer.compute_loss(trainer.model, trainer._prepare_inputs(batch))

        def logits(batch):
            inputs = {k: v for k, v in trainer._prepare_inputs(batch).items() if k not in ("labels", "label")}
            with trainer.autocast_smart_context_manager():
                return logits_of(trainer.model(**inputs))

        return ModelAccess(trainer.model, loss, logits,
                           lambda: self.batches(ctx.client_id, ctx.round, stream=3, cycle=False))
