"""One configuration run, its result as a plain record: ``refused`` (the error, and whether fedhf raised it with a
fix), ``crash`` (an error after the build), or the outcome. Runs in this process or in each process of a torchrun
launch (:mod:`.worker`), where process 0 also receives the other processes' dropout masks."""

from __future__ import annotations

import os
import tempfile
import traceback

from .oracles import refusal_ok
from .reference import build, run


def execute(spec: dict, world=None) -> dict:
    """One configuration; the environment is restored afterwards (an FSDP trainer sets accelerate's FSDP launch
    variables, which the next configuration of the same process would read as an FSDP launch)."""
    saved = dict(os.environ)
    try:
        return _execute(spec, world)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _execute(spec: dict, world=None) -> dict:
    folder = tempfile.mkdtemp(prefix="fedhf-matrix-")
    try:
        if world is not None:
            _sync_folder(world, folder)
        build(spec, folder)  # the refusal table: before any work
    except Exception as error:  # noqa: BLE001 -- every refusal, and any crash at build, is recorded
        return {"refused": str(error), "refusal_problem": refusal_ok(error)}
    try:
        outcome = run(spec, folder if world is None else _shared_folder(world, folder))
    except Exception as error:  # noqa: BLE001
        return {"crash": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-1500:]}
    record = {"state": outcome.state, "initial": outcome.initial, "history": outcome.history,
              "masks": outcome.masks}
    if world is not None:
        record["shard_masks"] = _gather(outcome.masks)
    return record


def _gather(masks):
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, masks)
    return out


_SHARED = {}


def _sync_folder(world, folder):
    """Every process writes into process 0's folder (checkpoints are read back by every process on resume)."""
    import torch.distributed as dist

    box = [folder]
    dist.broadcast_object_list(box, src=0)
    _SHARED["folder"] = box[0]


def _shared_folder(world, folder):
    return _SHARED.get("folder", folder)
