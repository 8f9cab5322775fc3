"""FederatedTrainer: ``transformers.Trainer`` whose ``train()`` is a federated round loop.

Everything else is Trainer's: ``evaluate()``/``compute_metrics``, callbacks and ``report_to``, ``save_model()``,
``push_to_hub()``, ``compute_loss``/``training_step`` overrides. One model instance is resident; a client is
simulated by loading the global trainable tensors into it, running K local steps and reading the result back,
so frozen base weights are never copied per client.

A round, top to bottom (ALGORITHMS.md section 4)::

    clients = sample S of N (seeded, without replacement)
    for each client: load x^r -> K local steps (clip, correction, optimizer) -> send w_i Delta_i (+ extras)
    sums of the messages -> correction's server half -> server rule -> x^{r+1}
    log train loss, lr, participants and communicated bytes; evaluate every ``eval_every_rounds``
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Dict, Iterator, List, Optional, Sequence

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader, Subset
from tqdm.auto import tqdm
from transformers import Trainer
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging

from .aggregation import RoundSums
from .config import FederatedConfig
from .context import ClientContext, ServerContext
from .data import partition_dataset, save_partition_report
from .hub import FEDERATED_TAGS, federated_card_section
from .metrics import plot_history, write_json_atomic
from .params import difference, federated_buffers, load_into, num_bytes, snapshot, trainable_parameters
from .schedule import round_learning_rate, sample_clients, stream_seed
from .state import ClientStateStore

HISTORY_FILE = "federated_history.json"
logger = logging.get_logger(__name__)


class FederatedTrainer(Trainer):
    """A drop-in for ``Trainer`` that trains over simulated clients.

    Args (beyond Trainer's):
        args: a :class:`FederatedConfig`.
        client_partitions: optional explicit split, one sequence of ``train_dataset`` row indices per client;
            by default the split comes from ``args.partition`` (dirichlet / iid / natural).
    """

    def __init__(self, model=None, args: Optional[FederatedConfig] = None, *trainer_args,
                 client_partitions: Optional[Sequence[Sequence[int]]] = None, **trainer_kwargs) -> None:
        if not isinstance(args, FederatedConfig):
            raise TypeError(f"FederatedTrainer needs `args=FederatedConfig(...)`, got {type(args).__name__}.")
        super().__init__(model, args, *trainer_args, **trainer_kwargs)
        if self.train_dataset is None:
            raise ValueError("FederatedTrainer needs a `train_dataset` to split over clients.")
        if not trainable_parameters(self.model):
            raise ValueError(
                "The model has no trainable parameters (every requires_grad is False): apply a peft adapter "
                "(e.g. get_peft_model(model, LoraConfig(...))) or unfreeze the weights to fine-tune."
            )
        self.algorithm = args.build_algorithm()
        if client_partitions is None:
            if not isinstance(self.train_dataset, datasets.Dataset):
                raise ValueError("Pass `client_partitions` when `train_dataset` is not a datasets.Dataset.")
            self.client_partitions, self.partition_summary = partition_dataset(self.train_dataset, args)
        else:
            self.client_partitions = self._check_partitions(client_partitions)
            self.partition_summary = {"num_clients": len(self.client_partitions),
                                      "sizes": [len(p) for p in self.client_partitions]}
        self.client_store = ClientStateStore()
        self.federated_history: List[dict] = []

    def _check_partitions(self, parts) -> List[np.ndarray]:
        parts = [np.asarray(p, dtype=np.int64) for p in parts]
        if len(parts) != self.args.num_clients:
            raise ValueError(f"`client_partitions` has {len(parts)} clients but `num_clients`={self.args.num_clients}.")
        rows = len(self.train_dataset)
        for i, p in enumerate(parts):
            if len(p) == 0 or p.min() < 0 or p.max() >= rows:
                raise ValueError(f"`client_partitions[{i}]` must be a non-empty list of row indices in [0, {rows}).")
        return parts

    # Trainer relies on accelerate's model wrapping for autocast; the resident model is never wrapped here
    # (wrapping in DDP would all-reduce every local backward), so autocast is entered explicitly.
    def autocast_smart_context_manager(self, cache_enabled: Optional[bool] = True):
        return self.accelerator.autocast()

    # ------------------------------------------------------------------ the round loop
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs) -> TrainOutput:
        if resume_from_checkpoint:
            raise NotImplementedError("Resuming a federated run is not supported yet; start the run again.")
        args, algo = self.args, self.algorithm
        start = time.time()
        self._train_data, self._collator = self._client_data_pipeline()
        if args.partition_report and self.is_world_process_zero():
            report = dict(self.partition_summary)
            report.update(algorithm=algo.describe())
            save_partition_report(report, args.output_dir)

        params = trainable_parameters(self.model)
        buffers = federated_buffers(self.model)
        global_params, global_buffers = snapshot(params), snapshot(buffers)
        server_state = algo.server.init(global_params)
        correction_state = algo.correction.server_init(global_params)
        self.current_gradient_accumulation_steps = 1
        self.state = TrainerState(max_steps=args.num_rounds, num_train_epochs=args.num_rounds)
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.state.is_world_process_zero = self.is_world_process_zero()
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        communicated = {"uplink": 0, "downlink": 0}
        if args.eval_on_start and self.eval_dataset is not None:
            self._record({"round": 0, "communicated_MB": 0.0, **self.evaluate(ignore_keys=ignore_keys_for_eval)})

        losses = []
        for r in range(args.num_rounds):
            self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
            round_lr = round_learning_rate(algo.optimizer.lr, r, args.num_rounds, args.round_lr_schedule)
            clients = sample_clients(args.seed, r, args.num_clients, args.clients_per_round)
            sums = RoundSums()
            downlink_each = num_bytes(global_params) + num_bytes(global_buffers) + num_bytes(correction_state)
            for cid in tqdm(self._clients_of_this_process(clients), desc=f"round {r + 1}/{args.num_rounds}",
                            leave=False, disable=args.disable_tqdm or not self.is_local_process_zero()):
                ctx = ClientContext(
                    client_id=cid, round=r, round_lr=round_lr, local_lr=round_lr * algo.correction.lr_scale,
                    local_steps=args.local_steps, weight=self._client_weight(cid), params=params,
                    global_params=global_params, server_state=correction_state, store=self.client_store, sums=sums,
                )
                load_into(params, global_params)
                load_into(buffers, global_buffers)
                self._train_client(ctx, buffers)
                sums.add("uplink_bytes", ctx.uplink_bytes)
                sums.add("downlink_bytes", downlink_each)

            sums.all_reduce()  # the only communication between processes in a round
            communicated["uplink"] += sums.scalar("uplink_bytes")
            communicated["downlink"] += sums.scalar("downlink_bytes")
            total_weight = sums.scalar("w")
            if total_weight > 0:
                mean_delta = {n: t / total_weight for n, t in sums.tensors("dx", global_params).items()}
                server_ctx = ServerContext(round=r, round_lr=round_lr, local_steps=args.local_steps,
                                           num_clients=args.num_clients, sums=sums, global_params=global_params,
                                           mean_delta=mean_delta)
                correction_state = algo.correction.server_update(correction_state, server_ctx)
                global_params, server_state = algo.server.apply(global_params, mean_delta, server_state)
                if global_buffers:
                    global_buffers = {n: t / total_weight for n, t in sums.tensors("buf", global_buffers).items()}
            else:
                logger.warning("round %d: no client survived; the global model is unchanged", r + 1)
            load_into(params, global_params)
            load_into(buffers, global_buffers)

            self.state.global_step = r + 1
            self.state.epoch = float(r + 1)
            round_loss = sums.scalar("loss") / total_weight if total_weight > 0 else float("nan")
            losses.append(round_loss)
            entry = {"round": r + 1, "train_loss": round_loss, "learning_rate": round_lr,
                     "participants": int(sums.scalar("n")), "excluded_clients": int(sums.scalar("excluded")),
                     "uplink_MB": communicated["uplink"] / 2**20, "downlink_MB": communicated["downlink"] / 2**20,
                     "communicated_MB": (communicated["uplink"] + communicated["downlink"]) / 2**20}
            self.log(dict(entry))
            last = r + 1 == args.num_rounds
            if self.eval_dataset is not None and (last or (args.eval_every_rounds and (r + 1) % args.eval_every_rounds == 0)):
                entry.update(self.evaluate(ignore_keys=ignore_keys_for_eval))
            if args.save_every_rounds and (r + 1) % args.save_every_rounds == 0 and not last:
                self._save_round(r + 1)
            self._record(entry)
            self.control = self.callback_handler.on_step_end(args, self.state, self.control)
            if self.control.should_training_stop:
                break

        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        if self.is_world_process_zero():
            plot_history(self.federated_history, os.path.join(args.output_dir, "federated_history.png"))
        metrics = {"train_loss": float(np.nanmean(losses)) if not np.all(np.isnan(losses)) else float("nan"), "train_runtime": time.time() - start,
                   "rounds": self.state.global_step, **{k: v for k, v in entry.items() if k.endswith("_MB")}}
        return TrainOutput(self.state.global_step, metrics["train_loss"], metrics)

    # ------------------------------------------------------------------ one client
    def _train_client(self, ctx: ClientContext, buffers: Dict[str, torch.Tensor]) -> None:
        args, algo, model = self.args, self.algorithm, self.model
        torch.manual_seed(stream_seed(args.seed, ctx.round, ctx.client_id, 1))  # dropout: per-client stream
        self.optimizer = algo.optimizer.build(ctx.params, ctx.local_lr)
        algo.correction.client_begin(ctx)
        batches = self._client_batches(ctx.client_id, ctx.round)
        loss_sum = torch.zeros((), dtype=torch.float64)
        for _ in range(args.local_steps):
            loss_sum += self.training_step(model, next(batches)).double()
            if args.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(ctx.params.values(), args.max_grad_norm)
            algo.correction.before_step(ctx)
            self.optimizer.step()
            algo.correction.after_step(ctx)
            self.optimizer.zero_grad(set_to_none=True)
        delta = difference(ctx.params, ctx.global_params)
        problem = self._faulty(loss_sum, delta)
        if problem:
            # Excluded from every sum (and its persistent state is left as it was), so it cannot poison the round.
            logger.warning("round %d: client %d excluded (%s)", ctx.round + 1, ctx.client_id, problem)
            ctx.sums.add("excluded", 1.0)
            self.optimizer = None
            return
        ctx.send("dx", delta, scale=ctx.weight)
        if buffers:
            ctx.send("buf", snapshot(buffers), scale=ctx.weight)
        algo.correction.client_end(ctx)
        ctx.sums.add("w", ctx.weight)
        ctx.sums.add("n", 1.0)
        ctx.sums.add("loss", loss_sum / args.local_steps, scale=ctx.weight)
        self.optimizer = None

    def _faulty(self, loss_sum: torch.Tensor, delta: Dict[str, torch.Tensor]) -> Optional[str]:
        if not torch.isfinite(loss_sum):
            return "non-finite loss"
        squared = sum(d.double().pow(2).sum() for d in delta.values())
        if not torch.isfinite(squared):
            return "non-finite update"
        bound = self.args.max_update_norm
        if bound is not None and squared.sqrt() > bound:
            return f"update norm {squared.sqrt():.3g} > max_update_norm {bound}"
        return None

    def _clients_of_this_process(self, clients: List[int]) -> List[int]:
        """A fixed client -> process map (client id modulo world size), so per-client state stays where its
        client trains. Every random draw inside a client comes from its own (seed, round, client) stream, so the
        result does not depend on the number of processes."""
        return [c for c in clients if c % self.args.world_size == self.args.process_index]

    def _client_weight(self, cid: int) -> float:
        return float(len(self.client_partitions[cid])) if self.args.client_weighting == "num_samples" else 1.0

    def _client_data_pipeline(self):
        data, collator = self.train_dataset, self.data_collator
        if isinstance(data, datasets.Dataset):
            data = self._remove_unused_columns(data, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        return data, collator

    def _client_batches(self, cid: int, round_index: int) -> Iterator[dict]:
        """The client's data, reshuffled per pass from its own stream and cycled for as many steps as asked."""
        generator = torch.Generator().manual_seed(stream_seed(self.args.seed, round_index, cid, 2))
        loader = DataLoader(Subset(self._train_data, self.client_partitions[cid].tolist()),
                            batch_size=self.args.per_device_train_batch_size, shuffle=True, generator=generator,
                            collate_fn=self._collator, num_workers=self.args.dataloader_num_workers)
        while True:
            yield from loader

    # ------------------------------------------------------------------ outputs
    def create_model_card(self, *args, tags=None, **kwargs) -> None:
        """Trainer's card, tagged and with a section saying how the model was trained federatedly."""
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        super().create_model_card(*args, tags=tags + [t for t in FEDERATED_TAGS if t not in tags], **kwargs)
        path = os.path.join(self.args.output_dir, "README.md")
        if self.is_world_process_zero() and os.path.exists(path):
            with open(path, "a") as f:
                f.write(federated_card_section(self.args, self.algorithm, self.partition_summary,
                                               self.federated_history))

    def _record(self, entry: dict) -> None:
        self.federated_history.append(entry)
        if self.is_world_process_zero():
            write_json_atomic(self.federated_history, os.path.join(self.args.output_dir, HISTORY_FILE))

    def _save_round(self, round_number: int) -> None:
        """Save the global model to output_dir/round-N, atomically: a crash leaves no half-written folder."""
        final = os.path.join(self.args.output_dir, f"round-{round_number}")
        tmp = final + ".tmp"
        if self.is_world_process_zero():
            shutil.rmtree(tmp, ignore_errors=True)
        self.save_model(tmp)
        if not self.is_world_process_zero():
            return
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
