"""FederatedTrainer: ``transformers.Trainer`` whose ``train()`` is a federated round loop.

Everything else is Trainer's: ``evaluate()``/``compute_metrics``, callbacks and ``report_to``, ``save_model()``,
``push_to_hub()``, ``compute_loss``/``training_step`` overrides. One model instance is resident; a client is
simulated by loading the global trainable tensors into it, running K local steps and reading the result back,
so frozen base weights are never copied per client.

A round: sample the clients; each loads x^r, runs K local steps (clip, correction, optimizer) and sends its
messages; their sums go through the components' server halves and the server rule to x^{r+1}; the round is logged
and evaluated every ``eval_every_rounds`` (docs/architecture.md, "One round", draws it with every protocol).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Callable, Dict, Hashable, List, Optional, Sequence

import datasets
import numpy as np
import torch
from transformers import Trainer
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging

from ..core.context import ClientContext, ServerContext
from ..core.params import load_into, snapshot, trainable_parameters
from ..core.schedule import round_clients, round_learning_rate
from ..core.client_store import ClientStateStore
from ..core.sums import RoundSums
from ..data import given_split, split_dataset
from ..data.checks import check_datasets, check_evaluation_set, check_not_streaming
from ..optim import ModelAccess, OptimizerHooks
from ..runtime.activation_checkpointing import enable_activation_checkpointing
from ..runtime.compiled_model import compile_resident, without_accelerate_compile
from ..runtime.liger import apply_liger, check_liger
from ..runtime.determinism import fix_thread_count
from ..runtime.contiguous_head import feed_head_contiguously
from ..runtime.processes import (destroy_process_group_at_exit, launch_mismatch, process_world,
                                 wait_for_every_process)
from ..runtime.quantization import prepare_quantised_base
from ..runtime.sharded import ShardedGathering, shard_resident_model, sharding_requested
from ..sharing.plan import SharingPlan
from ..state.run import RunState, refuse_to_overwrite, resolve_checkpoint
from .hooks.best_round import BestRound, check_best_metric
from .runners.client_data import ClientData, check_partitions
from .config.combinations import check_combinations
from .config.clock_settings import budget_reached
from .config.federated_config import FederatedConfig
from .hooks.base import HookList, RoundHook
from .runners.labelled_positions import LabelledPositionsLoss, projects_labelled_positions_only
from .every_row_evaluation import EveryRowEvaluation
from .hooks.privacy import Privacy
from .hooks.round_features import round_hooks
from .config.llm_guidance import warn_sgd_lr
from .runners.client_round import ClientRound, faulty
from .runners.loss_scaling import LossScale
from .runners.memory_plan import check_budget, plan_memory, plan_text
from .hooks.outputs import HISTORY_FILE, restore_run
from .late_metrics import LateMetricsLog
from .published import PublishedModel
from .runners.hp_search import check_search, default_hp_space, run_trial
from .runners.base import choose_runner
from ..server.server_needs import base_fold, gathering
from .config.settings import expose_rounds_to_callbacks, should_evaluate, should_log, should_save

logger = logging.get_logger(__name__)


class FederatedTrainer(EveryRowEvaluation, LabelledPositionsLoss, LateMetricsLog, PublishedModel, Trainer):
    """A drop-in for ``Trainer`` that trains over simulated clients.

    Args (beyond Trainer's):
        args: a :class:`FederatedConfig`.
        client_partitions: optional explicit split, one sequence of ``train_dataset`` row indices per client;
            by default the split comes from ``args.partition`` (dirichlet / iid / natural).
        partition_key: optional callable row -> hashable key that the dirichlet/natural split runs over instead
            of ``args.partition_key`` (fedhf/data/keys.py).
        round_hooks: optional list of the user's own :class:`fedhf.RoundHook` instances, called at every event of
            the round loop after the built-in diagnostics and before compression and privacy (docs/round_hooks.md).

    ``client_eval_partitions[i]``: client i's held-out rows of ``train_dataset`` (``args.client_eval_fraction``
    of its rows, never trained on; empty when the fraction is 0), for a personalised evaluation.
    """

    fused_lm_head = False  # True where the loss projects the head in tiles (trl's; the memory plan reads it)

    def __init__(self, model=None, args: Optional[FederatedConfig] = None, *trainer_args,
                 client_partitions: Optional[Sequence[Sequence[int]]] = None,
                 partition_key: Optional[Callable[[dict], Hashable]] = None,
                 round_hooks: Optional[Sequence[RoundHook]] = None, **trainer_kwargs) -> None:
        if not isinstance(args, FederatedConfig):
            raise TypeError(f"FederatedTrainer needs `args=FederatedConfig(...)`, got {type(args).__name__}.")
        wrong = [type(h).__name__ for h in (round_hooks or []) if not isinstance(h, RoundHook)]
        if wrong:
            raise TypeError(f"`round_hooks` takes instances of fedhf.RoundHook (subclass it and override the events "
                            f"you need: docs/round_hooks.md), got {wrong}.")
        self.user_round_hooks: List[RoundHook] = list(round_hooks or [])
        # how this trainer was built, for the trials of hyperparameter_search (fedhf/trainer/runners/hp_search.py)
        self.construction = (trainer_args, dict(trainer_kwargs, client_partitions=client_partitions,
                                                partition_key=partition_key, round_hooks=round_hooks))
        self.search_trial = None  # the optuna trial this trainer's run is, reported at evaluation rounds
        # by name or by position (Trainer's order: data_collator, train_dataset); Trainer's own error names max_steps
        train_dataset = trainer_kwargs.get("train_dataset", trainer_args[1] if len(trainer_args) > 1 else None)
        check_not_streaming(train_dataset, "train_dataset")
        check_liger(args)  # use_liger_kernel: a CUDA GPU and liger-kernel, or refused here (runtime/liger.py)
        super().__init__(model, args, *trainer_args, **trainer_kwargs)
        if sharding_requested(args):
            # fedhf shards the model itself (fedhf/runtime/sharded.py); on GPUs accelerate holds an FSDP plugin too
            # (not on CPUs), which would send Trainer's evaluation through accelerator.prepare(model) (refused by
            # FSDP2 without an optimizer) and save_model through its own gather (nothing written under
            # SHARDED_STATE_DICT). Trainer's plain paths evaluate the resident model and save fedhf's gather.
            self.is_fsdp_enabled = False
        if (args.fp16_full_eval or args.bf16_full_eval) and not self.is_model_parallel and self.model_init is None:
            # Trainer leaves the model off the device for a full-precision-eval cast and moves it when train()
            # starts; the round loop's state is built here, on the model's device, so it moves now.
            self._move_model_to_device(self.model, args.device)
        if self.train_dataset is None:
            raise ValueError("FederatedTrainer needs a `train_dataset` to split over clients.")
        if not trainable_parameters(self.model):
            raise ValueError(
                "The model has no trainable parameters (every requires_grad is False): apply a peft adapter "
                "(e.g. get_peft_model(model, LoraConfig(...))) or unfreeze the weights to fine-tune."
            )
        # the process map and the round's all-reduce count the same processes
        self.world = process_world(args, args.client_parallel, sharding_requested(args))
        mismatch = launch_mismatch(self.world)  # e.g. `accelerate launch --num_processes 2` without --multi_gpu
        if mismatch:
            logger.warning(mismatch)
        prepare_quantised_base(self.model)
        self._set_signature_columns_if_needed()
        check_datasets(self.model, args, self.train_dataset, self.eval_dataset, self.compute_metrics,
                       self._signature_columns)
        check_evaluation_set(args, self.eval_dataset, self.callback_handler.callbacks)
        check_best_metric(args, self.callback_handler.callbacks)  # a personal_eval_* metric_for_best_model
        self.algorithm = args.built_algorithm()  # built once, by the config (rebuilt there if a field changed)
        self.sharing = args.built_sharing()
        self.sharing_roles = self.sharing.roles(self.model)  # shared / personal / frozen, refused here
        check_combinations(self, FederatedTrainer)  # every refused combination, before any work (one table)
        warn_sgd_lr(self)  # an SGD algorithm at an AdamW-scale lr on a causal LM (fedhf/trainer/config/llm_guidance.py)
        # what the aggregator needs of the round, and how clients are trained: chosen once, here
        aggregator = self.algorithm.server_rule.aggregator
        self.base_fold = base_fold(self.model, aggregator)  # FedEx-LoRA, FLoRA: the base weights they change
        self.shards = shard_resident_model(self.model, args, self.world)  # FSDP2 (fedhf/runtime/sharded.py)
        # robust rules: every client's update; sharded: the sums stay per shard
        self.gathering = ShardedGathering(self.shards) if self.shards.active else gathering(aggregator)
        self.client_data = ClientData(self)
        self.runner = choose_runner(self)  # sequential, batched clients or client-parallel
        self.client_round = ClientRound(self)  # one client's begin, steps and finish
        if client_partitions is None:
            if not isinstance(self.train_dataset, datasets.Dataset):
                raise ValueError("Pass `client_partitions` when `train_dataset` is not a datasets.Dataset.")
            split = split_dataset(self.train_dataset, args, partition_key)
        elif partition_key is not None:
            raise ValueError("Pass either `client_partitions` or `partition_key`, not both: each says how to split.")
        else:
            split = given_split(check_partitions(client_partitions, args.num_clients, len(self.train_dataset)), args)
        self.client_partitions, self.client_eval_partitions = split.train, split.eval
        self.partition_summary = split.report
        self.partition_summary["torch_threads"] = fix_thread_count(args.full_determinism, args.world_size)
        budget = None if args.client_state_budget_mb is None else int(args.client_state_budget_mb * 2**20)
        spill_dir = args.client_state_dir or os.path.join(args.output_dir, "client_state")
        if self.world.size > 1:  # each process spills the clients it owns
            spill_dir = os.path.join(spill_dir, f"process-{self.world.rank}")
        self.client_store = ClientStateStore(budget, spill_dir, self.model_device)
        self.federated_history: List[dict] = []
        # a causal LM's head only where labels are (compute_loss, prediction_step: fedhf/trainer/runners/labelled_positions.py)
        self.labelled_logits = projects_labelled_positions_only(self)
        feed_head_contiguously(self.model)  # a sliced head input is a slow path on CPU (runtime/contiguous_head.py)
        apply_liger(self.model, args)  # use_liger_kernel: Liger's Triton kernels patched in, once
        compile_resident(self.model, args)  # torch_compile: once, in place, for every client (runtime/compiled_model.py)

    def _build_accelerator_args(self, **kwargs) -> dict:
        return without_accelerate_compile(super()._build_accelerator_args(**kwargs))  # compiled once, in place

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
    def hyperparameter_search(self, hp_space=None, compute_objective=None, n_trials: int = 20,
                              direction="minimize", backend=None, hp_name=None, **kwargs):
        """Trainer's search with each trial a federated run in ``<output_dir>/trial-<n>`` (optuna only; the
        keyword arguments reach ``optuna.create_study``: fedhf/trainer/runners/hp_search.py)."""
        check_search(self, backend)
        return super().hyperparameter_search(hp_space or default_hp_space, compute_objective, n_trials, direction,
                                             "optuna", hp_name, **kwargs)

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs) -> TrainOutput:
        """Run the rounds. ``resume_from_checkpoint``: a ``checkpoint-N`` folder (or an older run's
        ``checkpoint-round-N``), or True for the latest in ``output_dir``; the resumed run ends with the same model
        as an uninterrupted one. Every optional round feature is a round hook (fedhf/trainer/hooks/base.py).

        ``is_in_train`` is True while it runs, as in Trainer: Trainer's evaluation loop then evaluates the resident
        model as it is, where outside training ``bf16_full_eval``/``fp16_full_eval`` cast it in place."""
        if trial is not None and self.hp_search_backend is not None:
            return run_trial(self, trial)  # a trial of hyperparameter_search: a federated run of its own
        self.is_in_train = True
        try:
            return self._train_rounds(resume_from_checkpoint, ignore_keys_for_eval)
        finally:
            self.is_in_train = False

    def _train_rounds(self, resume_from_checkpoint, ignore_keys_for_eval) -> TrainOutput:
        args, start = self.args, time.time()
        # 1. the checkpoint to resume, checked before any work (a fresh run overwrites no finished one); every
        # process looks once process 0, which writes the checkpoints, has finished the previous run's
        wait_for_every_process()
        checkpoint = resolve_checkpoint(args.output_dir, resume_from_checkpoint)
        if checkpoint is None:
            refuse_to_overwrite(args.output_dir, args.overwrite_output_dir, HISTORY_FILE)
        # 2. the run's parts: client data, loss scale, sharing plan, Trainer's state, best round, round hooks
        self._prepare_run(ignore_keys_for_eval)
        # 3. the run's state, fresh or restored (with its history, best round and loss scale)
        run = self._fresh_run() if checkpoint is None else restore_run(self, checkpoint)
        # 4. the memory plan (printed; refused over memory_budget_gb before any file is written)
        self._plan_run(run)
        # 5. the global model into the resident model; Trainer's callbacks, then the hooks, begin
        self._load_global(run)
        self._begin_callbacks(run)
        self.hooks.on_train_begin(self, run)
        # 6. the rounds: a round is one step and one epoch of the TrainerState (callbacks see both)
        while run.rounds_done < args.num_rounds and not self.control.should_training_stop:
            self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
            entry = self._run_round(run, self.plan.params, self.plan.buffers)
            self._end_step(run, entry)
            if self.control.should_evaluate:  # the round schedule's, or a callback's; on_evaluate clears it
                metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
                entry.update(metrics)
                self.hooks.after_evaluate(self, run, entry)
                if self.search_trial is not None:  # optuna: the objective at this round; its pruner may stop here
                    self._report_to_hp_search(self.search_trial, run.rounds_done, metrics)
            if self.hooks.after_round(self, run, entry):
                self.control.should_training_stop = True
        # 7. the end: the hooks (best round loaded, ...), then Trainer's callbacks
        self.hooks.on_train_end(self, run)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        finite = [x for x in run.losses if np.isfinite(x)]
        metrics = {"train_loss": float(np.mean(finite)) if finite else float("nan"),
                   "train_runtime": time.time() - start, "rounds": run.rounds_done,
                   "uplink_MB": run.uplink_bytes / 2**20, "downlink_MB": run.downlink_bytes / 2**20}
        return TrainOutput(run.rounds_done, metrics["train_loss"], metrics)

    def _prepare_run(self, ignore_keys_for_eval) -> None:
        args = self.args
        self.ignore_keys_for_eval = ignore_keys_for_eval
        self.client_data.prepare()
        self.loss_scale = LossScale(self.accelerator.scaler)  # fp16: accelerate's GradScaler, driven per local step
        self.client_round.prepare(self.loss_scale, together=self.runner.size > 1)  # the run's step pipeline
        enable_activation_checkpointing(self.model, args)
        destroy_process_group_at_exit()
        self.plan = SharingPlan(self.sharing, self.sharing_roles, self.model, args.seed,  # shared/personal/frozen
                                self.algorithm.server_rule.aggregator.freezes_lora_a,  # FedSVD: A is the server's
                                args.lora_client_ranks)  # each client's first r_i LoRA components
        if self.shards.active:  # the round reads and writes FSDP's local shards (fedhf/runtime/sharded.py)
            self.plan.params = self.shards.local_views(self.plan.params)
        self.state = TrainerState(max_steps=args.num_rounds, num_train_epochs=args.num_rounds)
        self.best_round = BestRound(args)
        self.privacy = Privacy(self)  # DP and secure aggregation; its secret also draws the cohorts under DP
        self.hooks = HookList(round_hooks(self))

    def _fresh_run(self) -> RunState:
        """Round 0's state: only the shared part is federated."""
        params, algo = snapshot(self.plan.params), self.algorithm
        self.federated_history = []
        return RunState(params, snapshot(self.plan.buffers), algo.server_rule.init(snapshot(self.plan.params)),
                        algo.correction.server_init(snapshot(self.plan.params)), sync_state={},
                        personal_init=snapshot(self.plan.personal), base_params=self.base_fold.initial())

    def _plan_run(self, run: RunState) -> None:
        self.memory_plan = plan_memory(self, run)  # fedhf/trainer/runners/memory_plan.py
        if self.is_world_process_zero():
            if self.world.size > 1:  # a multi-process run says so first (a 1-process run is the plain case)
                print(f"fedhf: {self.world.describe()}")
            print(plan_text(self.memory_plan, self.args))
        check_budget(self.memory_plan, self.args)

    def _load_global(self, run: RunState) -> None:
        """The global model into the resident model: the shared tensors, buffers and folded base weights, and as
        its personal part the clients' weighted mean (fedhf/sharing/plan.py; the initial one before any client
        has trained, so a resumed run with no round left evaluates and saves the finished run's model)."""
        load_into(self.plan.params, run.global_params)
        load_into(self.plan.buffers, run.global_buffers)
        weights = {c: self.client_data.weight(c) for c in range(self.args.num_clients)}
        self.plan.load_global_personal(self.client_store, weights, run.personal_init, self.world.sends_messages,
                                       self.model_device)
        self.base_fold.load(run.base_params)

    def _begin_callbacks(self, run: RunState) -> None:
        self.current_gradient_accumulation_steps = 1
        self.state.global_step = run.rounds_done
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.state.is_world_process_zero = self.is_world_process_zero()
        expose_rounds_to_callbacks(self.args, self.state, self.eval_dataset is not None)
        self.control = self.callback_handler.on_train_begin(self.args, self.state, self.control)

    def _end_step(self, run: RunState, entry: dict) -> None:
        """Trainer's state after a round, its log, and the control flags the round schedule raises (a callback may
        raise or clear them too; they are acted on after the step and epoch end, as in Trainer's loop)."""
        args = self.args
        self.state.global_step = run.rounds_done
        self.state.epoch = float(run.rounds_done)
        if should_log(args, run.rounds_done):
            self.log(dict(entry))
        has_eval = self.eval_dataset is not None
        self.control.should_evaluate |= should_evaluate(args, run.rounds_done, has_eval)
        last = budget_reached(args, entry) or self.privacy.next_round_over_budget()  # a budget stops the run here
        self.control.should_evaluate |= has_eval and last  # the last round is evaluated, as num_rounds'
        self.control.should_save |= should_save(args, run.rounds_done)
        self.control = self.callback_handler.on_step_end(args, self.state, self.control)
        self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)

    def _run_round(self, run: RunState, params, buffers) -> dict:
        """One round (docs/architecture.md, "One round"). Returns the round's log."""
        args, algo, r = self.args, self.algorithm, run.rounds_done
        # 1. the round's learning rate, clients and sharing (RoLoRA's frozen factor); the hooks' round begins
        round_lr = round_learning_rate(algo.local_optimizer.lr, r, args.num_rounds, args.round_lr_schedule)
        # under DP the sample is drawn from the run's secret, not the printed seed (amplification needs it secret)
        size = self.hooks.sample_size(self, run, args.clients_per_round)  # e.g. the clock's over-selection
        clients = round_clients(self.privacy.cohort_seed(), r, args.num_clients, size, args.client_sampling)
        run.started = list(clients)  # a hook that finds a client offline before it starts takes it out (the clock)
        run.cohort = clients = self.hooks.select_clients(self, run, clients)  # e.g. the clock's offline and late
        added = sorted(set(clients) - set(run.started))
        if added and self.privacy.secure:  # their pair masks would cancel against no partner's
            raise ValueError(f"round {r + 1}: a round hook's select_clients added clients {added} that were not "
                             f"sampled; under secure aggregation the masks are agreed between the sampled clients "
                             "(run.started) before training, so a hook may only drop clients: select from the "
                             "clients it is given.")
        self.plan.begin_round(r)
        self.hooks.before_round(self, run)
        # 2. this process's clients, by the runner chosen at __init__: their messages into the round's sums
        sums = RoundSums()
        self.runner.train_clients(run, clients, round_lr, sums)
        # 3. the round's only communication, then the hooks on the summed messages
        self.gathering.all_reduce(sums, self.model_device)
        self.loss_scale.agree(self.world.size, self.model_device)  # fp16: one loss scale for all processes again
        self.hooks.after_sums(self, run, sums)
        # 4. the server update (each server half reads the sums of its own component's messages)
        if sums.scalar("w") > 0:
            self._server_update(run, sums, round_lr)
        else:
            logger.warning("round %d: %s; the global model is unchanged", r + 1,
                           "the round's sum was withheld (fewer survivors than dp_min_survivors)"
                           if sums.scalar("n") > 0 else "no client survived")
        # 5. the new global model into the resident model
        self._load_global(run)
        self.plan.end_round()
        # 6. the round's log; the hooks add to it (drift) and read it (the exclusion guard)
        entry = {**run.close_round(sums, round_lr), "processes": self.world.size}
        if "muon_lr_mult" in algo.local_optimizer.kwargs:  # Muon's matrices step at learning_rate x muon_lr_mult
            entry["muon_matrix_lr"] = round_lr * algo.local_optimizer.kwargs["muon_lr_mult"]
        self.hooks.after_aggregate(self, run, sums, entry)
        return entry

    def _server_update(self, run: RunState, sums: RoundSums, round_lr: float) -> None:
        args, algo, total_weight = self.args, self.algorithm, sums.scalar("w")
        mean_delta = {n: t / total_weight for n, t in sums.tensors("dx", run.global_params).items()}
        ctx = ServerContext(round=run.rounds_done, round_lr=round_lr, local_steps=args.local_steps,
                            num_clients=args.num_clients, sums=sums, global_params=run.global_params,
                            mean_delta=mean_delta, gathered=sums.gathered_in_client_order(),
                            frozen=self.plan.frozen_now(), trainers=self.plan.trainers(), seed=args.seed)
        run.correction_state = algo.correction.server_update(run.correction_state,
                                                             replace(ctx, sums=sums.within("correction")))
        run.sync_state = algo.state_sync.server_update(run.sync_state, replace(ctx, sums=sums.within("sync")))
        previous = run.global_params
        run.global_params, run.server_state = algo.server_rule.apply(
            run.global_params, run.server_state, replace(ctx, sums=sums.within("server")))
        run.global_params = self.plan.hold_frozen(run.global_params, previous)  # RoLoRA's frozen factor
        # FedEx-LoRA, FLoRA: the product residual into the frozen base weights (no layer otherwise: nothing)
        run.base_params = self.base_fold.fold(run.base_params, algo.server_rule.base_residual(
            run.global_params, replace(ctx, sums=sums.within("server"))))
        run.global_buffers = {n: t / total_weight for n, t in sums.tensors("buf", run.global_buffers).items()}

    # ------------------------------------------------------------------ one client (fedhf/trainer/runners/client_round.py)
    # The runners reach a client's round through these four, as Trainer's loop reaches training_step, so a subclass
    # may override them to observe or change one client's round; each delegates once to the ClientRound.
    def _begin_client(self, ctx: ClientContext, access: Optional[ModelAccess] = None) -> OptimizerHooks:
        return self.client_round.begin(ctx, access)

    def _local_steps(self, ctx: ClientContext, optimizer: OptimizerHooks) -> float:
        """A sequential client's K local steps (batched chunks share theirs); returns its summed loss."""
        return self.client_round.steps(ctx, optimizer, self.runner.backward)

    def _finish_client(self, ctx: ClientContext, optimizer: OptimizerHooks, loss_sum: float,
                       buffers: Dict[str, torch.Tensor], sums: RoundSums) -> None:
        self.client_round.finish(ctx, optimizer, loss_sum, buffers, sums)

    def _faulty(self, loss_sum: float, delta: Dict[str, torch.Tensor]) -> Optional[str]:
        return faulty(loss_sum, delta, self.args.max_update_norm, self.shards.total)
