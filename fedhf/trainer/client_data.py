"""What a client reads in its round: its rows and weight, its batches (its own seeded stream) and the model access
curvature-aware optimizers get. A mixin of :class:`fedhf.trainer.FederatedTrainer`."""

from __future__ import annotations

from typing import Iterator, List

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from ..core.context import ClientContext
from ..runtime.model_outputs import logits_of
from ..optim import ModelAccess
from ..core.schedule import stream_seed


class ClientData:
    def _check_partitions(self, parts) -> List[np.ndarray]:
        parts = [np.asarray(p, dtype=np.int64) for p in parts]
        if len(parts) != self.args.num_clients:
            raise ValueError(f"`client_partitions` has {len(parts)} clients but `num_clients`={self.args.num_clients}.")
        rows = len(self.train_dataset)
        for i, p in enumerate(parts):
            if len(p) == 0 or p.min() < 0 or p.max() >= rows:
                raise ValueError(f"`client_partitions[{i}]` must be a non-empty list of row indices in [0, {rows}).")
        return parts

    def _client_weight(self, cid: int) -> float:
        return float(len(self.client_partitions[cid])) if self.args.client_weighting == "num_samples" else 1.0

    def _client_data_pipeline(self):
        data, collator = self.train_dataset, self.data_collator
        if isinstance(data, datasets.Dataset):
            data = self._remove_unused_columns(data, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        return data, collator

    def _client_batches(self, cid: int, round_index: int, stream: int = 2, cycle: bool = True) -> Iterator[dict]:
        """The client's data, reshuffled per pass from its own stream and cycled for as many steps as asked."""
        generator = torch.Generator().manual_seed(stream_seed(self.args.seed, round_index, cid, stream))
        rows, batch_size = self.client_partitions[cid].tolist(), self.args.per_device_train_batch_size
        # dataloader_drop_last (e.g. for BatchNorm models, which cannot train on a 1-row batch) only where the
        # client still has a full batch.
        loader = DataLoader(Subset(self._train_data, rows), batch_size=batch_size, shuffle=True, generator=generator,
                            collate_fn=self._collator, num_workers=self.args.dataloader_num_workers,
                            drop_last=self.args.dataloader_drop_last and len(rows) >= batch_size)
        yield from loader
        while cycle:
            yield from loader

    def _model_access(self, ctx: ClientContext) -> ModelAccess:
        """What curvature-aware optimizers (Sophia, FOOF) may use: the model, the training loss and logits of a
        batch (under the trainer's autocast), and one fresh pass over the client's data (its own stream)."""

        def loss(batch):
            with self.compute_loss_context_manager():
                return self.compute_loss(self.model, self._prepare_inputs(batch))

        def logits(batch):
            inputs = {k: v for k, v in self._prepare_inputs(batch).items() if k not in ("labels", "label")}
            with self.autocast_smart_context_manager():
                return logits_of(self.model(**inputs))

        return ModelAccess(self.model, loss, logits,
                           lambda: self._client_batches(ctx.client_id, ctx.round, stream=3, cycle=False))
