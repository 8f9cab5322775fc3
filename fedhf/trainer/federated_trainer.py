"""FederatedTrainer: ``transformers.Trainer`` whose ``train()`` is a federated round loop.

Everything else is Trainer's: ``evaluate()``/``compute_metrics``, callbacks and ``report_to``, ``save_model()``,
``push_to_hub()``, ``compute_loss``/``training_step`` overrides. One model instance is resident; a client is
simulated by loading the global trainable tensors into it, running K local steps and reading the result back,
so frozen base weights are never copied per client.

A round, top to bottom (docs/algorithms.md section 4)::

    clients = sample S of N (seeded, without replacement)
    for each client: load x^r -> K local steps (clip, correction, optimizer) -> send w_i Delta_i (+ extras)
    (local optimizer built per client round; its state Theta warm-started / kept / reset by the state-sync rule)
    (each component's client half returns its message; the trainer adds it under the component's namespace)
    sums of the messages -> correction's and sync's server halves -> server rule -> x^{r+1}
    (docs/architecture.md draws it as data flow, with each axis's protocol)
    log train loss, lr, participants, communicated bytes and the drift Delta_D; evaluate every ``eval_every_rounds``
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from typing import Callable, Dict, Hashable, List, Optional, Sequence

import datasets
import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import Trainer
from transformers.integrations.neftune import activate_neftune, deactivate_neftune
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging

from ..core.sums import RoundSums
from ..runtime.processes import destroy_process_group_at_exit
from ..runtime.activation_checkpointing import enable_activation_checkpointing
from .client_data import ClientData
from .client_parallel import ClientParallel, check_client_parallel
from .config import FederatedConfig
from ..core.context import ClientContext, ServerContext, TrainedPart
from ..data import given_split, save_partition_report, split_dataset
from ..data.checks import check_datasets, check_evaluation_set, check_not_streaming
from .batched_round import BatchedRound, check_batched_clients
from .personal_eval import PersonalEvaluation, check_personal_eval
from ..sharing.client_ranks import ClientRanks, check_client_ranks
from .loss_scaling import LossScale
from .best_round import BestRound
from ..runtime.determinism import fix_thread_count
from .guards import ExclusionGuard
from ..metrics import drift, plot_history, spectral_drift
from .memory_plan import check_budget, plan_memory
from ..core.message import Message
from ..runtime.model_outputs import loss_items
from ..optim import ModelAccess, OptimizerHooks
from ..core.params import difference, load_into, num_bytes, snapshot, trainable_parameters
from ..runtime.processes import process_world
from ..runtime.quantization import prepare_quantised_base
from ..core.schedule import round_learning_rate, sample_clients, stream_seed
from ..core.client_store import ClientStateStore
from ..state.rotation import rotate_checkpoints
from .outputs import HISTORY_FILE, RunOutputs
from ..sharing.plan import SharingPlan, sharing_roles
from ..runtime.lora_layers import BaseFold
from ..state.run import RunState, refuse_to_overwrite, resolve_checkpoint
from .settings import expose_rounds_to_callbacks, should_evaluate, should_log, should_save

logger = logging.get_logger(__name__)


class FederatedTrainer(RunOutputs, BatchedRound, ClientParallel, ClientData, PersonalEvaluation, Trainer):
    """A drop-in for ``Trainer`` that trains over simulated clients.

    Args (beyond Trainer's):
        args: a :class:`FederatedConfig`.
        client_partitions: optional explicit split, one sequence of ``train_dataset`` row indices per client;
            by default the split comes from ``args.partition`` (dirichlet / iid / natural).
        partition_key: optional callable row -> hashable key that the dirichlet/natural split runs over instead
            of ``args.partition_key`` (fedhf/data/keys.py).

    ``client_eval_partitions[i]``: client i's held-out rows of ``train_dataset`` (``args.client_eval_fraction``
    of its rows, never trained on; empty when the fraction is 0), for a personalised evaluation.
    """

    def __init__(self, model=None, args: Optional[FederatedConfig] = None, *trainer_args,
                 client_partitions: Optional[Sequence[Sequence[int]]] = None,
                 partition_key: Optional[Callable[[dict], Hashable]] = None, **trainer_kwargs) -> None:
        if not isinstance(args, FederatedConfig):
            raise TypeError(f"FederatedTrainer needs `args=FederatedConfig(...)`, got {type(args).__name__}.")
        # by name or by position (Trainer's order: data_collator, train_dataset); Trainer's own error names max_steps
        train_dataset = trainer_kwargs.get("train_dataset", trainer_args[1] if len(trainer_args) > 1 else None)
        check_not_streaming(train_dataset, "train_dataset")
        super().__init__(model, args, *trainer_args, **trainer_kwargs)
        if self.train_dataset is None:
            raise ValueError("FederatedTrainer needs a `train_dataset` to split over clients.")
        if not trainable_parameters(self.model):
            raise ValueError(
                "The model has no trainable parameters (every requires_grad is False): apply a peft adapter "
                "(e.g. get_peft_model(model, LoraConfig(...))) or unfreeze the weights to fine-tune."
            )
        # the process map and the round's all-reduce count the same processes
        self.world = process_world(args, args.client_parallel)
        check_personal_eval(args, self.world.size)
        prepare_quantised_base(self.model)
        self._set_signature_columns_if_needed()
        check_datasets(self.model, args, self.train_dataset, self.eval_dataset, self.compute_metrics,
                       self._signature_columns)
        check_evaluation_set(args, self.eval_dataset, self.callback_handler.callbacks)
        self.algorithm = args.built_algorithm()  # built once, by the config (rebuilt there if a field changed)
        self.sharing = args.built_sharing()
        self.sharing_roles = sharing_roles(self.sharing, self.model, self.algorithm)  # refused here, before work
        check_client_ranks(args.lora_client_ranks, trainable_parameters(self.model), self.algorithm,
                           args.batched_clients)
        self.base_fold = BaseFold(self.model, self.algorithm.server_rule.folds_into_base,  # FedEx-LoRA, FLoRA
                                  args.load_best_model_at_end)
        check_batched_clients(self)
        check_client_parallel(self)
        if client_partitions is None:
            if not isinstance(self.train_dataset, datasets.Dataset):
                raise ValueError("Pass `client_partitions` when `train_dataset` is not a datasets.Dataset.")
            split = split_dataset(self.train_dataset, args, partition_key)
        elif partition_key is not None:
            raise ValueError("Pass either `client_partitions` or `partition_key`, not both: each says how to split.")
        else:
            split = given_split(self._check_partitions(client_partitions), args)
        self.client_partitions, self.client_eval_partitions = split.train, split.eval
        self.partition_summary = split.report
        self.partition_summary["torch_threads"] = fix_thread_count(args.full_determinism, args.world_size)
        budget = None if args.client_state_budget_mb is None else int(args.client_state_budget_mb * 2**20)
        spill_dir = args.client_state_dir or os.path.join(args.output_dir, "client_state")
        if self.world.size > 1:  # each process spills the clients it owns
            spill_dir = os.path.join(spill_dir, f"process-{self.world.rank}")
        self.client_store = ClientStateStore(budget, spill_dir, self.model_device)
        self.federated_history: List[dict] = []
        self._correction_rounds: Dict[int, object] = {}  # each training client's correction state (client_begin's)

    @property
    def model_device(self) -> torch.device:
        """Where the trainable parameters live (the model's device): the round's sums, restored checkpoints and
        spilled client state are put there, as the tensors they are combined with are."""
        return next(iter(trainable_parameters(self.model).values())).device

    # Trainer relies on accelerate's model wrapping for autocast; the resident model is never wrapped here
    # (wrapping in DDP would all-reduce every local backward), so autocast is entered explicitly.
    def autocast_smart_context_manager(self, cache_enabled: Optional[bool] = True):
        return self.accelerator.autocast()

    # ------------------------------------------------------------------ the round loop
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs) -> TrainOutput:
        """Run the rounds. ``resume_from_checkpoint``: a ``checkpoint-N`` folder (or an older run's
        ``checkpoint-round-N``), or True for the latest in ``output_dir``; the resumed run ends with the same model
        as an uninterrupted one."""
        args = self.args
        start = time.time()
        checkpoint = resolve_checkpoint(args.output_dir, resume_from_checkpoint)  # checked before any work starts
        if checkpoint is None:
            refuse_to_overwrite(args.output_dir, args.overwrite_output_dir, HISTORY_FILE)
        self._train_data, self._collator = self._client_data_pipeline()
        self.loss_scale = LossScale(self.accelerator.scaler)  # fp16: accelerate's GradScaler, driven per local step
        enable_activation_checkpointing(self.model, args)
        # NEFTune (Jain et al. 2023, arXiv:2310.05914): Trainer attaches its embedding-noise hook in its own loop.
        neftune = activate_neftune(self.model, args.neftune_noise_alpha) if args.neftune_noise_alpha else None
        destroy_process_group_at_exit()
        self.plan = SharingPlan(self.sharing, self.sharing_roles, self.model, args.seed,  # shared/personal/frozen
                                self.algorithm.server_rule.aggregator.freezes_lora_a)  # FedSVD: A is the server's
        params, buffers = self.plan.params, self.plan.buffers  # only the shared part is federated
        self.client_ranks = ClientRanks(args.lora_client_ranks, params) if args.lora_client_ranks else None
        self.state = TrainerState(max_steps=args.num_rounds, num_train_epochs=args.num_rounds)
        best = BestRound(args)
        if checkpoint is None:
            run = RunState(snapshot(params), snapshot(buffers), self.algorithm.server_rule.init(snapshot(params)),
                           self.algorithm.correction.server_init(snapshot(params)), sync_state={},
                           personal_init=snapshot(self.plan.personal), base_params=self.base_fold.initial())
            self.federated_history = []
        else:
            run = self._restore(checkpoint, best)  # with the best round, into ``best`` and self.state
        self.memory_plan = plan_memory(self, run)  # fedhf/trainer/memory_plan.py: printed once, refused over the budget
        if self.is_world_process_zero():
            print(self.memory_plan)
        check_budget(self.memory_plan, args)
        if args.partition_report and self.is_world_process_zero():
            save_partition_report({**self.partition_summary, "algorithm": self.algorithm.describe()}, args.output_dir)
        load_into(params, run.global_params)
        load_into(buffers, run.global_buffers)
        # the global personal part from the (restored) clients' tensors: a resumed run that has no round left
        # evaluates and saves the finished run's model, not the initial personal tensors
        weights = {c: self._client_weight(c) for c in range(args.num_clients)}
        self.plan.load_global_personal(self.client_store, weights, run.personal_init, self.world.sends_messages,
                                       self.model_device)
        self.base_fold.load(run.base_params)
        self.current_gradient_accumulation_steps = 1
        self.state.global_step = run.rounds_done
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.state.is_world_process_zero = self.is_world_process_zero()
        expose_rounds_to_callbacks(args, self.state, self.eval_dataset is not None)
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start and self.eval_dataset is not None and checkpoint is None:
            self._record({"round": 0, "communicated_MB": 0.0, **self.evaluate(ignore_keys=ignore_keys_for_eval),
                          **self._personal_metrics(run, 0)})

        guard = ExclusionGuard(args.max_excluded_rounds)
        while run.rounds_done < args.num_rounds and not self.control.should_training_stop:
            # A round is one step and one epoch of the TrainerState (callbacks see both).
            self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
            entry = self._run_round(run, params, buffers)
            guard.after_round(entry, self.algorithm.local_optimizer.lr, args.max_update_norm)
            self.state.global_step = run.rounds_done
            self.state.epoch = float(run.rounds_done)
            if should_log(args, run.rounds_done):
                self.log(dict(entry))
            # The round schedule raises Trainer's control flags; a callback may raise (or clear) them too, and they
            # are acted on after the step and epoch ends, as in Trainer's _maybe_log_save_evaluate.
            self.control.should_evaluate |= should_evaluate(args, run.rounds_done, self.eval_dataset is not None)
            self.control.should_save |= should_save(args, run.rounds_done)
            self.control = self.callback_handler.on_step_end(args, self.state, self.control)
            self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
            self._evaluate_and_save(run, entry, best, ignore_keys_for_eval)

        self.loaded_best_round = best.load_at_end(self.state, params, {**buffers, **self.plan.personal})
        if self.loaded_best_round is not None:  # the saved model and its card are that round's
            logger.info("loaded the best round's model (round %d, %s=%s)", self.state.best_global_step,
                        best.metric, self.state.best_metric)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        if neftune is not None:
            deactivate_neftune(self.model, neftune)
        if self.is_world_process_zero():
            plot_history(self.federated_history, os.path.join(args.output_dir, "federated_history.png"))
        finite = [x for x in run.losses if np.isfinite(x)]
        metrics = {"train_loss": float(np.mean(finite)) if finite else float("nan"),
                   "train_runtime": time.time() - start, "rounds": run.rounds_done,
                   "uplink_MB": run.uplink_bytes / 2**20, "downlink_MB": run.downlink_bytes / 2**20}
        return TrainOutput(run.rounds_done, metrics["train_loss"], metrics)

    def _evaluate_and_save(self, run: RunState, entry: dict, best: BestRound, ignore_keys) -> None:
        """The round's evaluation, history entry and checkpoint, as the control flags ask (their events clear them)."""
        if self.control.should_evaluate:
            entry.update(self.evaluate(ignore_keys=ignore_keys))
            best.after_evaluate(self.state, entry, self.plan.params,  # as evaluated: personal parts too
                                {**self.plan.buffers, **self.plan.personal})
        entry.update(self._personal_metrics(run, run.rounds_done))  # personalized_eval: fedhf/trainer/personal_eval.py
        self._record(entry)
        if self.control.should_save:
            self._save_checkpoint(run, best)
            rotate_checkpoints(self.args.output_dir, self.args.save_total_limit, self.state.best_global_step)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _run_round(self, run: RunState, params, buffers) -> dict:
        """One round: this process's clients, one all-reduce, the server update. Returns the round's log."""
        args, algo, r = self.args, self.algorithm, run.rounds_done
        round_lr = round_learning_rate(algo.local_optimizer.lr, r, args.num_rounds, args.round_lr_schedule)
        clients = sample_clients(args.seed, r, args.num_clients, args.clients_per_round)
        sums = RoundSums()
        self.plan.begin_round(r)  # RoLoRA: this round's frozen LoRA factor
        self._round_thetas = []  # (w_i, Theta_i) of this process's clients, for the spectral drift only
        downlink_each = sum(num_bytes(group) for group in (run.global_params, run.global_buffers,
                                                           run.correction_state, run.sync_state))
        downlink_each += num_bytes(run.base_params) if r else 0  # FedEx-LoRA: the residual folded into the base
        mine = self.world.clients_of_this_process(sorted(clients))
        counted = sums if self.world.sends_messages else RoundSums()  # client_parallel: each client counted once
        chunks = [mine[i:i + args.batched_clients] for i in range(0, len(mine), args.batched_clients)]
        for chunk in tqdm(chunks, desc=f"round {r + 1}/{args.num_rounds}", leave=False,
                          disable=args.disable_tqdm or not self.is_local_process_zero()):
            contexts = [ClientContext(
                client_id=cid, round=r, round_lr=round_lr, local_lr=round_lr * algo.correction.lr_scale,
                local_steps=args.local_steps, weight=self._client_weight(cid), params=params,
                global_params=run.global_params, correction_state=run.correction_state, store=self.client_store,
                sync_state=run.sync_state, participants=clients, num_clients=args.num_clients,
                trained=TrainedPart(self.plan.frozen_now(), self.client_ranks.masks(cid) if self.client_ranks else {}),
            ) for cid in chunk]
            load_into(params, run.global_params)
            load_into(buffers, run.global_buffers)
            if args.batched_clients > 1:  # no personal tensors here (refused): nothing per client to load
                self._train_clients_together(contexts, counted)  # fedhf/trainer/batched_round.py
            else:
                self.plan.load_personal(self.client_store, chunk[0], run.personal_init)
                self._train_client(contexts[0], buffers, counted)
            counted.add("downlink_bytes", downlink_each * len(chunk))

        sums.all_reduce(gather=algo.server_rule.gathers, device=self.model_device)  # the round's only communication
        self.loss_scale.agree(self.world.size, self.model_device)  # fp16: one loss scale for all processes again
        total_weight = sums.scalar("w")
        if total_weight > 0:
            mean_delta = {n: t / total_weight for n, t in sums.tensors("dx", run.global_params).items()}
            server_ctx = ServerContext(round=r, round_lr=round_lr, local_steps=args.local_steps,
                                       num_clients=args.num_clients, sums=sums, global_params=run.global_params,
                                       mean_delta=mean_delta, gathered=sums.gathered_in_client_order(),
                                       frozen=self.plan.frozen_now(),
                                       trainers=self.client_ranks.trainers() if self.client_ranks else {},
                                       seed=args.seed)
            # each server half reads the sums of its own component's messages
            run.correction_state = algo.correction.server_update(run.correction_state,
                                                                 replace(server_ctx, sums=sums.within("correction")))
            run.sync_state = algo.state_sync.server_update(run.sync_state,
                                                           replace(server_ctx, sums=sums.within("sync")))
            previous = run.global_params
            run.global_params, run.server_state = algo.server_rule.apply(
                run.global_params, run.server_state, replace(server_ctx, sums=sums.within("server")))
            run.global_params = self.plan.hold_frozen(run.global_params, previous)  # RoLoRA's frozen factor
            if algo.server_rule.folds_into_base:  # FedEx-LoRA: the product residual into the frozen base weights
                run.base_params = self.base_fold.fold(run.base_params, algo.server_rule.base_residual(
                    run.global_params, replace(server_ctx, sums=sums.within("server"))))
            if run.global_buffers:
                run.global_buffers = {n: t / total_weight for n, t in sums.tensors("buf", run.global_buffers).items()}
        else:
            logger.warning("round %d: no client survived; the global model is unchanged", r + 1)
        load_into(params, run.global_params)
        load_into(buffers, run.global_buffers)
        # the global model: shared parts + the clients' weighted mean personal part (fedhf/sharing/plan.py)
        weights = {c: self._client_weight(c) for c in range(args.num_clients)}
        self.plan.load_global_personal(self.client_store, weights, run.personal_init, self.world.sends_messages,
                                       self.model_device)
        self.plan.end_round()
        self.base_fold.load(run.base_params)
        theta_sums = sums.within("sync")
        spectral = (spectral_drift(self._round_thetas, theta_sums, total_weight, self.model_device)
                    if args.drift_spectral else None)
        self._round_thetas = []

        run.rounds_done = r + 1
        run.uplink_bytes += sums.scalar("uplink_bytes")
        run.downlink_bytes += sums.scalar("downlink_bytes")
        run.losses.append(sums.scalar("loss") / total_weight if total_weight > 0 else float("nan"))
        return {"round": r + 1, "train_loss": run.losses[-1], "learning_rate": round_lr,
                "participants": int(sums.scalar("n")), "excluded_clients": int(sums.scalar("excluded")),
                "uplink_MB": run.uplink_bytes / 2**20, "downlink_MB": run.downlink_bytes / 2**20,
                "communicated_MB": (run.uplink_bytes + run.downlink_bytes) / 2**20,
                **(drift(theta_sums, total_weight) or {}), **(spectral or {})}

    # ------------------------------------------------------------------ one client
    def _train_client(self, ctx: ClientContext, buffers: Dict[str, torch.Tensor], sums: RoundSums) -> None:
        """K local steps from x^r, then the client's messages (or its exclusion) into the round's sums."""
        optimizer = self._begin_client(ctx)
        loss_sum = self._local_steps(ctx, optimizer)
        self._finish_client(ctx, optimizer, loss_sum, buffers, sums)

    def _begin_client(self, ctx: ClientContext, access: Optional[ModelAccess] = None) -> OptimizerHooks:
        """The client's correction, seeded streams and optimizer (with its state-sync warm start and the
        model-aware part of its round: ``access``, by default :meth:`_model_access`)."""
        algo = self.algorithm
        if self.client_ranks is not None:  # lora_client_ranks: this client's first r_i components only
            self.client_ranks.truncate(ctx.client_id)
        self._correction_rounds[ctx.client_id] = algo.correction.client_begin(ctx)
        torch.manual_seed(stream_seed(self.args.seed, ctx.round, ctx.client_id, 1))  # dropout, curvature draws
        # Train mode before anything runs the model: curvature hooks run before training_step (which would set
        # it), and the first client after an evaluation would otherwise estimate curvature in eval mode.
        self.model.train()
        optimizer = algo.local_optimizer.build(self.plan.trained(ctx.params), ctx.local_lr)  # shared + personal
        algo.state_sync.client_begin(ctx, self.plan.theta_target(optimizer))  # RoLoRA: the trained factor's Theta
        optimizer.attach(access or self._model_access(ctx))
        return optimizer

    def _finish_client(self, ctx: ClientContext, optimizer: OptimizerHooks, loss_sum: float,
                       buffers: Dict[str, torch.Tensor], sums: RoundSums) -> None:
        """The client's messages (or its exclusion) into the round's sums."""
        algo = self.algorithm
        correction_round = self._correction_rounds.pop(ctx.client_id)
        delta = difference(ctx.params, ctx.global_params)
        problem = self._faulty(loss_sum, delta)
        if problem:
            # Excluded from every sum (and its persistent state is left as it was), so it cannot poison the round.
            logger.warning("round %d: client %d excluded (%s)", ctx.round + 1, ctx.client_id, problem)
            sums.add("excluded", 1.0)
            return
        self.plan.keep_personal(self.client_store, ctx.client_id)
        own = Message().put("dx", delta, scale=ctx.weight,  # the trainer's own message: un-namespaced keys
                            nbytes=self.plan.sent_bytes(delta))  # RoLoRA: the frozen factor's zeros are not sent
        if algo.server_rule.gathers:
            sums.gather(ctx.client_id, delta)
        if buffers:
            own.put("buf", snapshot(buffers), scale=ctx.weight)
        messages = {"correction": algo.correction.client_end(ctx, correction_round)}
        theta = self.plan.shared_theta(optimizer.export_theta())
        messages["sync"] = algo.state_sync.client_end(ctx, theta, optimizer.theta_structure(theta))
        if self.args.drift_spectral and theta and self.world.sends_messages:
            self._round_thetas.append((ctx.weight, theta))
        messages["server"] = algo.server_rule.client_end(ctx, optimizer)
        own.put_scalar("w", ctx.weight).put_scalar("n", 1.0)
        own.put_scalar("loss", float(loss_sum) / self.args.local_steps * ctx.weight)
        sums.add_message(own)
        for namespace, message in messages.items():
            sums.add_message(message, namespace)
        sums.add("uplink_bytes", own.nbytes + sum(m.nbytes for m in messages.values()))

    def _local_steps(self, ctx: ClientContext, optimizer: OptimizerHooks) -> float:
        """The local loop; returns the summed loss (a Python float, read from the model's device once per client,
        not once per step: a read waits for the device's queued work). A local step
        is one optimizer step over ``gradient_accumulation_steps`` micro-batches (see :meth:`_accumulate`);
        curvature refreshes (on the first micro-batch), clipping and corrections act once per step."""
        args = self.args
        self.optimizer = optimizer
        batches = self._client_batches(ctx.client_id, ctx.round)
        loss_sum = 0.0
        for step in range(args.local_steps):
            micro_batches = [next(batches) for _ in range(args.gradient_accumulation_steps)]
            optimizer.before_forward(step, micro_batches[0])
            loss_sum += (self._accumulate_shards(micro_batches) if self.world.client_parallel and self.world.size > 1
                         else self._accumulate(micro_batches))  # fedhf/trainer/client_parallel.py: a batch over processes
            self._optimizer_step(ctx, optimizer)
            self.loss_scale.update()
        optimizer.end_round()
        self.optimizer = None
        return float(loss_sum)

    def _optimizer_step(self, ctx: ClientContext, optimizer: OptimizerHooks) -> None:
        """Clip the gradient, then the correction's hooks around the optimizer's step (see fedhf.corrections); under
        fp16 on unscaled gradients, and skipped when one overflowed (fedhf/trainer/loss_scaling.py)."""
        trained = self.plan.trained(ctx.params).values()
        self.loss_scale.step(trained, lambda: self._clipped_step(ctx, optimizer, trained))
        optimizer.zero_grad(set_to_none=True)

    def _clipped_step(self, ctx: ClientContext, optimizer: OptimizerHooks, trained) -> None:
        max_norm = self.args.max_grad_norm
        if max_norm is not None and max_norm > 0:  # Trainer's meaning: <= 0 = no clipping
            torch.nn.utils.clip_grad_norm_(trained, max_norm)
        correction_round = self._correction_rounds[ctx.client_id]
        self.algorithm.correction.before_step(ctx, correction_round)
        optimizer.step()
        self.algorithm.correction.after_step(ctx, correction_round)
        if self.client_ranks is not None:  # nothing revives the components beyond the client's rank
            self.client_ranks.truncate(ctx.client_id)

    def _accumulate(self, micro_batches: List[dict]):
        """Gradients of one optimizer step over G micro-batches, equal to those of one backward over their union;
        returns the union's loss (a float64 tensor on the model's device, or 0.0 when nothing was run).

        Which mean: the model's own loss is a mean over its micro-batch; each micro-batch is weighted by its share
        of the union's items, so the step sees the union's mean. Items are label tokens != -100 when labels are
        per token (causal LMs: the per-token mean of the union, counted after the shift a causal-LM loss makes;
        token classifiers likewise without the shift) and rows otherwise (sequence/image classifiers: the per-row
        mean). The weight goes through the divisor Trainer's ``training_step`` applies (a plain 1/G would
        overweight a short micro-batch). With G = 1 nothing changes.

        A micro-batch without a single item (every label -100) has nothing to learn and is not run (the model's
        mean over it would be 0/0 = NaN and exclude the client). A step whose micro-batches all lack one leaves
        every gradient None (the optimizers skip such parameters) and adds 0 to the summed loss, which the round
        still divides by local_steps (the same as for G > 1).
        """
        if len(micro_batches) == 1:
            if loss_items(micro_batches[0], self._loss_shifts_labels) == 0:
                return 0.0
            return self.training_step(self.model, micro_batches[0]).double()
        if self.compute_loss_func is not None or self.loss_is_scaled_for_ga:
            raise ValueError("gradient_accumulation_steps > 1 needs the model's own mean loss; a `compute_loss_func` "
                             "(or a loss already scaled for accumulation) cannot be weighted per micro-batch. Use "
                             "gradient_accumulation_steps=1 and a larger per_device_train_batch_size.")
        items = [loss_items(batch, self._loss_shifts_labels) for batch in micro_batches]
        loss = 0.0
        for batch, n in zip(micro_batches, items):
            if n == 0:  # nothing to learn from (all labels masked): its mean would be NaN
                continue
            self.current_gradient_accumulation_steps = sum(items) / n
            loss = loss + self.training_step(self.model, batch).double()
        self.current_gradient_accumulation_steps = 1
        return loss

    def _faulty(self, loss_sum: float, delta: Dict[str, torch.Tensor]) -> Optional[str]:
        if not math.isfinite(loss_sum):
            return "non-finite loss"
        squared = sum(d.double().pow(2).sum() for d in delta.values())
        if not torch.isfinite(squared):
            return "non-finite update"
        bound = self.args.max_update_norm
        if bound is not None and squared.sqrt() > bound:
            return f"update norm {squared.sqrt():.3g} > max_update_norm {bound}"
        return None
