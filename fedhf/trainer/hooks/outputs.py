"""What a federated run writes and reads back, as round hooks: the history, round checkpoints (the run's state plus
the global model as ``FederatedTrainer._write_model`` writes it), their Hub pushes, and the resume from a
checkpoint. They use the trainer's ``args``, ``algorithm``, ``world``, ``client_store``, ``best_round``,
``federated_history`` and ``state``."""

from __future__ import annotations

import os
from typing import Dict

import torch
from transformers.utils import logging

from .base import RoundHook
from .hook_state import check_same_on_every_process
from ..hub import push_round_checkpoint
from ..config.privacy_settings import dp_delta, dp_on
from ...data import save_partition_report
from ...metrics import plot_history, write_json_atomic
from ...state import load_checkpoint, save_checkpoint
from ...state.rotation import rotate_checkpoints
from ...state.checkpoint import PREFIX as CHECKPOINT_PREFIX, round_folder
from ...state.run import RunState, check_fingerprint, fingerprint
from ...state.shards import META_KEY as SHARDS_META_KEY, every_process_groups, own_groups

HISTORY_FILE = "federated_history.json"
logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------- round hooks: history, checkpoints, Hub
class EvalOnStart(RoundHook):
    """``eval_on_start``: the initial model evaluated as the history's round 0 (a fresh run with an eval_dataset);
    the round-0 entry then goes through every hook's ``after_round`` (personalised evaluation, history)."""

    def on_train_begin(self, trainer, run) -> None:
        if trainer.args.eval_on_start and trainer.eval_dataset is not None and run.rounds_done == 0:
            entry = {"round": 0, "communicated_MB": 0.0, **trainer.evaluate(ignore_keys=trainer.ignore_keys_for_eval)}
            trainer.hooks.after_round(trainer, run, entry)


class PartitionReport(RoundHook):
    """``partition_report``: the clients' split and the algorithm, written once before the first round. Not under
    DP: each client's row and label counts are client data the accountant does not cover (docs/privacy.md)."""

    def on_train_begin(self, trainer, run) -> None:
        if trainer.args.partition_report and dp_on(trainer.args):
            logger.info("partition_report: not written under dp_mode (each client's sizes and label counts are not "
                        "covered by the privacy accountant)")
        elif trainer.args.partition_report and trainer.is_world_process_zero():
            save_partition_report({**trainer.partition_summary, "algorithm": trainer.algorithm.describe()},
                                  trainer.args.output_dir)


class History(RoundHook):
    """Every round's entry in ``trainer.federated_history`` and in output_dir/federated_history.json."""

    def after_round(self, trainer, run, entry: dict) -> bool:
        trainer.federated_history.append(entry)
        if trainer.is_world_process_zero():
            write_json_atomic(trainer.federated_history, os.path.join(trainer.args.output_dir, HISTORY_FILE))
        return False


class HistoryPlot(RoundHook):
    def on_train_end(self, trainer, run) -> None:
        if trainer.is_world_process_zero():
            title = f"{trainer.algorithm.name}: {os.path.basename(os.path.normpath(trainer.args.output_dir))}"
            delta = dp_delta(trainer.args) if dp_on(trainer.args) else None
            plot_history(trainer.federated_history, os.path.join(trainer.args.output_dir, "federated_history.png"),
                         title=title, dp_delta=delta)


class Checkpoints(RoundHook):
    """A round checkpoint when ``control.should_save`` is raised (``save_every_rounds``, or a callback), then the
    rotation (``save_total_limit``, never the best round's) and the callbacks' ``on_save``, which clears it."""

    def after_round(self, trainer, run, entry: dict) -> bool:
        if trainer.control.should_save and run.rounds_done:  # round 0 (eval_on_start) has nothing to save
            save_round_checkpoint(trainer, run)
            rotate_checkpoints(trainer.args.output_dir, trainer.args.save_total_limit, trainer.state.best_global_step)
            trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
        return False


class HubPush(RoundHook):
    """``push_to_hub``: each round checkpoint's model, as ``hub_strategy`` says (in rounds)."""

    def on_checkpoint(self, trainer, run, directory: str) -> None:
        if trainer.args.push_to_hub:
            push_round_checkpoint(trainer.args, trainer.hub_model_id, os.path.join(directory, "model"),
                                  run.rounds_done)


def save_round_checkpoint(trainer, run: RunState) -> None:
    """output_dir/checkpoint-N (N = rounds done = ``state.global_step``, the name Trainer gives it): the run's
    state (safetensors + JSON, checksummed, written atomically) with the best round and the fp16 loss scale,
    and the global model as ``save_model`` writes it, under model/; then the hooks' ``on_checkpoint``."""
    args, state = trainer.args, trainer.state
    directory = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}{run.rounds_done}")
    best_directory = (directory if state.best_global_step == run.rounds_done  # an older run's may be named
                      else round_folder(args.output_dir, state.best_global_step))  # checkpoint-round-N
    if state.best_global_step == run.rounds_done or os.path.isdir(best_directory):  # as Trainer sets it
        state.best_model_checkpoint = best_directory
    if trainer.shards.active:  # every process's rows, each its own file (fedhf/state/shards.py)
        return save_sharded_round_checkpoint(trainer, run, directory)
    clients = gather_client_store(trainer)
    hook_meta, hook_groups = trainer.hooks.checkpoint_state(trainer, run)  # e.g. the privacy accountant
    check_same_on_every_process(hook_meta, trainer.world.size, hook_groups)  # one state, restored on every process
    if not trainer.is_world_process_zero():
        return
    best_meta, best_groups = trainer.best_round.to_checkpoint(state)
    meta = {**run.meta(), "history": trainer.federated_history,
            "fingerprint": fingerprint(args, trainer.algorithm), **best_meta, "hooks": hook_meta}
    if trainer.accelerator.scaler is not None:  # fp16: the scale a resumed run continues with
        meta["grad_scaler"] = trainer.accelerator.scaler.state_dict()
    save_checkpoint(directory, {**run.tensor_groups(), **best_groups, **hook_groups, "client_store": clients}, meta,
                    write_extra=trainer._write_model)
    trainer.hooks.on_checkpoint(trainer, run, directory)


def save_sharded_round_checkpoint(trainer, run: RunState, directory: str) -> None:
    """The round checkpoint of an FSDP run: each process's rows of every tensor group (its client states too), and
    the consolidated model under model/ (every process gathers it; process 0 writes)."""
    best_meta, best_groups = trainer.best_round.to_checkpoint(trainer.state)
    hook_meta, hook_groups = trainer.hooks.checkpoint_state(trainer, run)
    check_same_on_every_process(hook_meta, trainer.world.size)  # the meta is process 0's; the groups per process
    groups = {**run.tensor_groups(), **best_groups, **hook_groups, "client_store": trainer.client_store.to_tensors()}
    groups = every_process_groups(groups, trainer.world.rank, trainer.world.size)
    trainer._gathered_state = trainer.shards.full_state_dict()
    try:
        if trainer.is_world_process_zero():
            meta = {**run.meta(), "history": trainer.federated_history, "hooks": hook_meta,
                    "fingerprint": fingerprint(trainer.args, trainer.algorithm), **best_meta,
                    SHARDS_META_KEY: trainer.world.size}
            save_checkpoint(directory, groups, meta, write_extra=trainer._write_model)
            trainer.hooks.on_checkpoint(trainer, run, directory)
    finally:
        trainer._gathered_state = None


def gather_client_store(trainer) -> Dict[str, torch.Tensor]:
    """Every process's client states, on the main process (per-client state lives where its client trains)."""
    local = trainer.client_store.to_tensors()
    dist = torch.distributed
    if trainer.world.size == 1:
        return local
    parts = [None] * trainer.world.size
    # On the CPU: a pickled GPU tensor would be unpickled onto its sender's GPU.
    dist.all_gather_object(parts, {k: v.cpu() for k, v in local.items()})  # between this run's own processes only
    return {k: v for part in parts for k, v in part.items()}


def restore_run(trainer, path: str) -> RunState:
    """The run's state from a round checkpoint, on the model's device, with the best round (into
    ``trainer.best_round`` and ``trainer.state``) and the fp16 loss scale."""
    groups, meta = load_checkpoint(path, trainer.model_device)
    check_fingerprint(path, meta, fingerprint(trainer.args, trainer.algorithm))
    groups = own_groups(path, groups, meta, trainer.world.rank, trainer.world.size, trainer.shards.active)
    run = RunState.from_checkpoint(groups, meta)
    run.server_state = trainer.algorithm.server_rule.load_state(run.server_state)  # older checkpoints: position keys
    trainer.client_store.load_tensors(groups.get("client_store", {}), keep=trainer.world.owns)
    trainer.federated_history = list(meta["history"])
    trainer.best_round.from_checkpoint(trainer.state, meta, groups)
    scaler = trainer.accelerator.scaler
    if scaler is not None and "grad_scaler" in meta:
        scaler.load_state_dict(meta["grad_scaler"])
    trainer.hooks.restore_state(trainer, run, meta.get("hooks", {}), groups)
    logger.info("resumed from %s after round %d", path, run.rounds_done)
    return run
