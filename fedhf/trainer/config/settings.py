"""Every ``TrainingArguments`` field in the round loop: honoured (with its meaning in rounds), refused with the fix
named, or of no effect on the federated result (and why). docs/trainer_settings.md is generated from this table
(``python -m tests.trainer.config.settings_table``); tests/trainer/config/test_settings.py fails if a field of TrainingArguments is
missing from it or the page is stale.

One "step" of the trainer state is one round, so Trainer's step-counted settings become round-counted:
``eval_strategy="steps"``/``eval_steps`` -> ``eval_every_rounds``, ``save_strategy="steps"``/``save_steps`` ->
``save_every_rounds``, ``logging_steps`` -> log every N rounds.
"""

from __future__ import annotations

from typing import Dict, Tuple

HONOURED, REFUSED, NO_EFFECT = "honoured", "refused", "no effect"

_TRAINER_OWN = "Trainer's own (evaluate(), callbacks, logging), unchanged"
_SPEED = "speed only: same results"

# field -> (status, meaning in the round loop / the fix / why it has no effect)
SETTINGS: Dict[str, Tuple[str, str]] = {
    "output_dir": (HONOURED, "partition report, history, round checkpoints, save_model()"),
    "per_device_train_batch_size": (HONOURED, "rows per local step of a client"),
    "per_device_eval_batch_size": (HONOURED, "Trainer's own; over several processes every process evaluates every "
                                             "row in one process's batches (the metrics are one process's)"),
    "num_train_epochs": (REFUSED, "set `num_rounds` (R) and `local_steps` (K)"),
    "max_steps": (REFUSED, "set `num_rounds` (R) and `local_steps` (K)"),
    "learning_rate": (HONOURED, "peak local learning rate; over rounds it follows `round_lr_schedule`"),
    "lr_scheduler_kwargs": (REFUSED, "the schedule over rounds is `round_lr_schedule` (cosine or constant)"),
    "warmup_steps": (REFUSED, "no warmup over rounds: the schedule is `round_lr_schedule`"),
    "optim_args": (REFUSED, "pass optimizer keywords as `local_optimizer_kwargs`"),
    "weight_decay": (HONOURED, "local weight decay"),
    "adam_beta1": (REFUSED, "use `local_optimizer_kwargs={'betas': (b1, b2)}`"),
    "adam_beta2": (REFUSED, "use `local_optimizer_kwargs={'betas': (b1, b2)}`"),
    "adam_epsilon": (REFUSED, "use `local_optimizer_kwargs={'eps': ...}`"),
    "optim_target_modules": (REFUSED, "the local optimizer routes parameters itself (e.g. Muon's hidden_only)"),
    "average_tokens_across_devices": (HONOURED, "kept False: local steps never all-reduce gradients"),
    "max_grad_norm": (HONOURED, "clips each local step's gradient; <= 0 = no clipping"),
    "bf16": (HONOURED, "autocast in local steps and evaluation; on a CPU without bf16 matmul units, a warning "
                       "naming bf16=False"),
    "fp16": (HONOURED, "autocast on a GPU, with accelerate's loss scaling: gradients unscaled before clipping, a "
                       "local step with an inf/nan gradient skipped; refused on the CPU (use bf16 with use_cpu)"),
    "bf16_full_eval": (HONOURED, _TRAINER_OWN + "; evaluations inside train() leave the model's dtype alone, as "
                                 "Trainer's do (is_in_train)"),
    "fp16_full_eval": (HONOURED, _TRAINER_OWN + "; evaluations inside train() leave the model's dtype alone, as "
                                 "Trainer's do (is_in_train); refused on the CPU"),
    "tf32": (HONOURED, "set globally by TrainingArguments"),
    "use_liger_kernel": (HONOURED, "Liger's Triton kernels applied to the resident model when the trainer is built "
                                   "(on a CUDA GPU; refused on the CPU, and without liger-kernel installed)"),
    "liger_kernel_config": (HONOURED, "the keywords of that patching (rope, swiglu, rms_norm, ...), as Trainer's"),
    "use_cache": (HONOURED, "set on the model config by Trainer"),
    "torch_empty_cache_steps": (REFUSED, "not run in the round loop; leave it unset"),
    "auto_find_batch_size": (REFUSED, "set `per_device_train_batch_size` yourself"),
    "logging_strategy": (HONOURED, "'no': rounds are not logged to callbacks/report_to (the history file still is); "
                                   "'steps': every `logging_steps` rounds and the last; 'epoch': every round"),
    "logging_steps": (HONOURED, "log every N rounds (default 1 here); a fraction of the run (< 1) is refused, as "
                                "for eval_steps/save_steps: give whole rounds"),
    "logging_first_step": (HONOURED, "round 1 is logged too"),
    "log_on_each_node": (HONOURED, _TRAINER_OWN),
    "logging_nan_inf_filter": (NO_EFFECT, "a round's loss is the mean over surviving clients; nan only when all "
                                          "were excluded, which is logged as such"),
    "include_num_input_tokens_seen": (REFUSED, "tokens are not counted in the round loop; leave it 'no'"),
    "log_level": (HONOURED, _TRAINER_OWN),
    "log_level_replica": (HONOURED, _TRAINER_OWN),
    "disable_tqdm": (HONOURED, "hides the per-round client progress bar"),
    "report_to": (HONOURED, _TRAINER_OWN + "; one log per round; a round is a step and an epoch for callbacks "
                               "(on_save after each checkpoint; control.should_evaluate/should_save are acted on)"),
    "run_name": (HONOURED, _TRAINER_OWN),
    "project": (HONOURED, _TRAINER_OWN),
    "trackio_space_id": (HONOURED, _TRAINER_OWN),
    "trackio_bucket_id": (HONOURED, _TRAINER_OWN),
    "trackio_static_space_id": (HONOURED, _TRAINER_OWN),
    "eval_strategy": (HONOURED, "'steps': every `eval_steps` rounds (= `eval_every_rounds`); 'epoch': every round; "
                                "'no' (default): `eval_every_rounds` applies whenever an eval_dataset is given"),
    "eval_steps": (HONOURED, "rounds between evaluations (with eval_strategy='steps')"),
    "eval_delay": (HONOURED, "no evaluation before round `eval_delay` (the last round is always evaluated)"),
    "prediction_loss_only": (HONOURED, _TRAINER_OWN),
    "eval_on_start": (HONOURED, "evaluates the initial global model as round 0"),
    "eval_do_concat_batches": (HONOURED, _TRAINER_OWN),
    "eval_use_gather_object": (HONOURED, _TRAINER_OWN),
    "eval_accumulation_steps": (HONOURED, _TRAINER_OWN),
    "include_for_metrics": (HONOURED, _TRAINER_OWN),
    "batch_eval_metrics": (HONOURED, _TRAINER_OWN),
    "save_only_model": (REFUSED, "a round checkpoint always holds the run state (to resume) and model/; "
                                 "use save_model() for the model alone"),
    "save_strategy": (HONOURED, "'steps': every `save_steps` rounds (= `save_every_rounds`); 'epoch': every round; "
                                "'best' is refused: use load_best_model_at_end"),
    "save_steps": (HONOURED, "rounds between checkpoints (with save_strategy='steps')"),
    "save_on_each_node": (NO_EFFECT, "process 0 writes every checkpoint (client states are gathered to it)"),
    "save_total_limit": (HONOURED, "keeps the newest N checkpoint-* folders, and always the best round's"),
    "enable_jit_checkpoint": (REFUSED, "checkpoints are written every `save_every_rounds`; leave it False"),
    "push_to_hub": (HONOURED, "Trainer's push_to_hub() of the saved model; checked before any work"),
    "hub_token": (HONOURED, "Trainer's push_to_hub(); never logged"),
    "hub_private_repo": (HONOURED, "Trainer's push_to_hub()"),
    "hub_model_id": (HONOURED, "Trainer's push_to_hub()"),
    "hub_strategy": (HONOURED, "with save_every_rounds: 'every_save'/'checkpoint' push each round checkpoint's "
                               "model, 'all_checkpoints' under checkpoint-N/, 'end' only push_to_hub()"),
    "hub_always_push": (NO_EFFECT, "each round checkpoint is pushed before the next round starts (synchronously), "
                                   "so none is ever skipped, as with hub_always_push=True"),
    "hub_revision": (HONOURED, "Trainer's push_to_hub()"),
    "load_best_model_at_end": (HONOURED, "the best evaluated round's global model is loaded after the last round"),
    "metric_for_best_model": (HONOURED, "the metric that picks the best evaluated round (and EarlyStoppingCallback); "
                                        "a NaN is never best; a personal_eval_* metric too (personalized_eval)"),
    "greater_is_better": (HONOURED, "direction of metric_for_best_model; unset, fedhf's table of known names decides "
                                    "(fedhf/metrics/direction.py: mse, wer, ... lower) and refuses an unknown name"),
    "ignore_data_skip": (NO_EFFECT, "a resumed run redraws each client's data from (seed, round, client): "
                                    "nothing is skipped"),
    "restore_callback_states_from_checkpoint": (REFUSED, "round checkpoints do not hold callback states; "
                                                         "leave it False"),
    "full_determinism": (HONOURED, "Trainer enables deterministic kernels; fedhf also fixes torch's thread count"),
    "seed": (HONOURED, "client sampling, split, and per-(round, client) data/dropout streams"),
    "data_seed": (REFUSED, "client data order comes from `seed` per (round, client); leave it unset"),
    "use_cpu": (HONOURED, "accelerate's device choice"),
    "accelerator_config": (NO_EFFECT, "the resident model is never wrapped by accelerate (no gradient sync), and "
                                      "a map-style evaluation set is not split over processes (`even_batches` has nothing to pad; "
                                      "`dispatch_batches` or an iterable set keep Trainer's split: docs/scaling.md)"),
    "parallelism_config": (REFUSED, "tensor/context parallelism of the resident model is not supported"),
    "dataloader_drop_last": (HONOURED, "a client skips its last partial batch when it has a full one"),
    "dataloader_num_workers": (HONOURED, "workers of each client's loader"),
    "dataloader_pin_memory": (NO_EFFECT, "speed only: same results; set False where no accelerator is present "
                                         "(torch ignores it there, with a warning)"),
    "dataloader_persistent_workers": (NO_EFFECT, _SPEED),
    "dataloader_prefetch_factor": (NO_EFFECT, _SPEED),
    "dataloader_multiprocessing_context": (NO_EFFECT, _SPEED),
    "dataloader_in_order": (NO_EFFECT, _SPEED),
    "remove_unused_columns": (HONOURED, "as in Trainer, for client data and evaluation"),
    "label_names": (HONOURED, "as in Trainer; also where the data checks look for labels"),
    "train_sampling_strategy": (REFUSED, "each client reshuffles its own rows per pass; leave it 'random'"),
    "length_column_name": (NO_EFFECT, "used only by length-grouped sampling (train_sampling_strategy='group_by_length'), which is refused"),
    "ddp_find_unused_parameters": (NO_EFFECT, "local steps never run under DDP"),
    "ddp_bucket_cap_mb": (NO_EFFECT, "local steps never run under DDP"),
    "ddp_broadcast_buffers": (NO_EFFECT, "local steps never run under DDP"),
    "ddp_static_graph": (NO_EFFECT, "local steps never run under DDP"),
    "ddp_backend": (HONOURED, "the process group of the per-round all-reduce"),
    "ddp_timeout": (HONOURED, "the timeout of the per-round all-reduce's process group on GPU runs; with use_cpu "
                              "transformers does not pass it on, so a value other than 1800 is refused there"),
    "fsdp": (HONOURED, "the resident model sharded with FSDP2 over the processes (of a launch: on CPUs N >= 2, "
                       "else refused), which train every client "
                       "together (client_parallel is set; fedhf/runtime/sharded.py, docs/scaling.md)"),
    "fsdp_config": (HONOURED, "`transformer_layer_cls_to_wrap` (the FSDP units; default: the model's decoder layers; "
                              "a class no module has is refused) and `reshard_after_forward`; `version` must be 2; "
                              "other keys (`auto_wrap_policy`, `min_num_params`, `state_dict_type`, "
                              "`mixed_precision_policy`, ...) are refused"),
    "deepspeed": (REFUSED, "DeepSpeed's engine owns the optimizer step and the parameters (ZeRO partitions them "
                           "behind its own hooks), while the round loop must load, read and step each client's "
                           "tensors itself; use `fsdp` to shard the model instead"),
    "debug": (NO_EFFECT, "debug options of Trainer's own loop"),
    "skip_memory_metrics": (NO_EFFECT, "memory metrics of Trainer's own loop"),
    "do_train": (NO_EFFECT, "a flag for scripts, as in Trainer"),
    "do_eval": (NO_EFFECT, "a flag for scripts, as in Trainer"),
    "do_predict": (NO_EFFECT, "a flag for scripts, as in Trainer"),
    "resume_from_checkpoint": (NO_EFFECT, "a flag for scripts, as in Trainer: pass it to train()"),
    "local_rank": (HONOURED, "set by the launcher"),
    # The LLM fine-tuning settings (micro-batching, checkpointing, loss options), listed so that the table is complete.
    "gradient_accumulation_steps": (HONOURED, "a local step = one optimizer step over G micro-batches, the union's "
                                                 "per-token (causal LM) or per-row mean"),
    "activation_checkpointing": (HONOURED, "switched on at the start of the round loop, as Trainer does"),
    "activation_checkpointing_kwargs": (HONOURED, "passed on as Trainer does (every_n_layers, offload, ...)"),
    "gradient_checkpointing": (HONOURED, "deprecated alias of activation_checkpointing"),
    "gradient_checkpointing_kwargs": (HONOURED, "deprecated alias of activation_checkpointing_kwargs"),
    "lr_scheduler_type": (REFUSED, "the learning rate follows `round_lr_schedule` over rounds (constant within a "
                                   "round); set round_lr_schedule"),
    "optim": (REFUSED, "the local optimizer is the algorithm's; set `local_optimizer` (e.g. 'adamw')"),
    "label_smoothing_factor": (HONOURED, "the local loss (Trainer's compute_loss, called by every local step)"),
    "neftune_noise_alpha": (HONOURED, "noise on the input embeddings during local steps, removed after training"),
    "torch_compile": (HONOURED, "the resident model is compiled once, in place (nn.Module.compile, dynamic=None as "
                                "Trainer's); clients load values into the same tensors, so nothing recompiles per "
                                "client or round (a new chunk size C or input shape compiles once more)"),
    "torch_compile_backend": (HONOURED, "the backend of that compile (TrainingArguments' default: inductor)"),
    "torch_compile_mode": (HONOURED, "the mode of that compile (e.g. 'reduce-overhead', 'max-autotune')"),
}

# Refused fields whose TrainingArguments default is what the round loop does; any other value is refused.
_NOT_SET = (None, {}, [], "", False, "no")  # how parsers and TrainingArguments spell "unset"


def _is_default(config, name: str, default) -> bool:
    value = getattr(config, name)
    if value == default or (default in _NOT_SET and value in _NOT_SET):
        return True
    return str(getattr(value, "value", value)) == str(getattr(default, "value", default))


def refuse_unsupported(config, defaults: Dict[str, object]) -> None:
    """Raise on a refused field set away from its TrainingArguments default, naming the field and the fix."""
    for name, (status, fix) in SETTINGS.items():
        if status == REFUSED and name in defaults and not _is_default(config, name, defaults[name]):
            raise ValueError(f"`{name}`={getattr(config, name)!r} is not supported by the federated round loop: "
                             f"{fix}.")


def _strategy(value) -> str:
    return str(getattr(value, "value", value))


def _whole_rounds(value, field: str, alternative: str) -> int:
    if value is None or value < 1 or int(value) != value:
        raise ValueError(f"`{field}`={value!r} must be a whole number of rounds >= 1 here (one step is one round; "
                         f"a fraction of the run is not supported); or set `{alternative}` instead.")
    return int(value)


def map_round_strategies(config) -> None:
    """Trainer's step-counted eval/save strategies onto fedhf's round counters, before TrainingArguments checks
    them. Afterwards ``eval_strategy``/``save_strategy`` read "no" so that Trainer's own checks (an eval_dataset for
    eval_strategy, matching strategies for load_best_model_at_end) do not apply; the trainer exposes the round
    interval to callbacks when training starts (:func:`expose_rounds_to_callbacks`)."""
    evaluation = _strategy(config.eval_strategy)
    config.eval_strategy_given = evaluation  # kept: evaluating needs an eval_dataset (fedhf/data/checks.py)
    if evaluation == "steps":
        steps = config.eval_steps if config.eval_steps is not None else config.logging_steps
        config.eval_every_rounds = _whole_rounds(steps, "eval_steps", "eval_every_rounds")
    elif evaluation == "epoch":
        config.eval_every_rounds = 1
    saving = _strategy(config.save_strategy)
    if saving == "best":
        raise ValueError("`save_strategy='best'` is not supported: set `load_best_model_at_end=True` (the best "
                         "round is kept in memory and loaded at the end) and `save_every_rounds` for checkpoints.")
    if saving == "steps" and not config.save_every_rounds:
        config.save_every_rounds = _whole_rounds(config.save_steps, "save_steps", "save_every_rounds")
    elif saving == "epoch" and not config.save_every_rounds:
        config.save_every_rounds = 1
    if _strategy(config.logging_strategy) == "steps":  # like eval_steps/save_steps: whole rounds, no fraction
        _whole_rounds(config.logging_steps, "logging_steps", "logging_strategy='epoch'")
    config.eval_strategy, config.save_strategy = "no", "no"


def check_ddp_timeout(config) -> None:
    """transformers passes ``ddp_timeout`` to the process group only off the CPU: with ``use_cpu`` the group gets
    torch's default (30 minutes) whatever is set, so another value would be ignored silently."""
    import torch.distributed as dist

    if config.use_cpu and config.ddp_timeout != 1800 and not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"`ddp_timeout`={config.ddp_timeout} is not applied with use_cpu=True (transformers does not "
                         "pass it to a CPU process group): leave it at 1800, or create the group yourself before "
                         "building the config, e.g. torch.distributed.init_process_group('gloo', "
                         "timeout=datetime.timedelta(seconds=...)).")


def expose_rounds_to_callbacks(args, state, has_eval: bool) -> None:
    """What Trainer's callbacks read (EarlyStoppingCallback asserts eval_strategy != 'no'): with an eval_dataset,
    evaluation happens every ``eval_every_rounds`` steps (rounds). ``state.eval_steps`` says the same, so the
    evaluations Trainer's DefaultFlowCallback asks for are the rounds' own."""
    if has_eval:
        args.eval_strategy, args.eval_steps = "steps", args.eval_every_rounds or args.num_rounds
        state.eval_steps = args.eval_steps


def should_save(args, rounds_done: int) -> bool:
    """Every ``save_every_rounds`` rounds (0: never, unless a callback sets ``control.should_save``)."""
    return bool(args.save_every_rounds) and rounds_done % args.save_every_rounds == 0


def should_evaluate(args, rounds_done: int, has_eval: bool) -> bool:
    """Every ``eval_every_rounds`` rounds from round ``eval_delay`` on, and always after the last round."""
    if not has_eval:
        return False
    if rounds_done == args.num_rounds:
        return True
    return bool(args.eval_every_rounds) and rounds_done % args.eval_every_rounds == 0 and rounds_done >= args.eval_delay


def should_log(args, rounds_done: int) -> bool:
    """Per ``logging_strategy``: 'no' never, 'epoch' every round, 'steps' every ``logging_steps`` rounds, plus
    round 1 with ``logging_first_step`` and always the last."""
    strategy = _strategy(args.logging_strategy)
    if strategy == "no":
        return False
    if strategy == "epoch" or rounds_done == args.num_rounds or (args.logging_first_step and rounds_done == 1):
        return True
    return rounds_done % int(args.logging_steps) == 0  # a whole number >= 1 (map_round_strategies)
