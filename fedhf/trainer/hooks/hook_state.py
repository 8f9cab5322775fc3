"""The round hooks' state in a round checkpoint: each hook's own part, and one state for every process.

Each hook's ``checkpoint_state`` meta is stored under its own key, its class name (``VirtualClock``), with ``#k`` for
the k-th hook of one class (``UpdateNorms#2``), so two instances of a class do not overwrite each other; the k-th
instance's tensor groups are renamed ``<key>.<group>`` (the first keeps its names, as checkpoints before had them).
A hook gets back only its own meta and groups.

A round checkpoint keeps one hook state, which every process restores: each process must hold the same state (a
hook that counts what its own process saw totals it over the processes first, fedhf/trainer/hooks/process_totals.py).
:func:`check_same_on_every_process` compares the processes' metas and tensor groups (by digest) when a checkpoint is
written and names what differs, rather than resume every process with process 0's state.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ...core.params import TensorDict

PER_HOOK = "per_hook"  # the checkpoint meta's key of the hooks' metas by hook key (older checkpoints: one merged dict)


def hook_keys(hooks: Sequence) -> List[str]:
    """Each hook's key in the checkpoint: its class name, ``#k`` added for the k-th instance of a class (k >= 2)."""
    seen: Counter = Counter()
    keys = []
    for hook in hooks:
        name = hook.state_name
        seen[name] += 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys


def group_prefix(key: str) -> str:
    return f"{key}." if "#" in key else ""


def collect(hooks: Sequence, trainer, run) -> Tuple[dict, Dict[str, TensorDict]]:
    """Every hook's checkpoint state: ``{PER_HOOK: {key: meta}}`` and the groups, renamed per :func:`group_prefix`."""
    metas: dict = {}
    groups: Dict[str, TensorDict] = {}
    for key, hook in zip(hook_keys(hooks), hooks):
        meta, own = hook.checkpoint_state(trainer, run)
        if meta:
            metas[key] = meta
        groups.update({group_prefix(key) + name: tensors for name, tensors in own.items()})
    return {PER_HOOK: metas}, groups


def hand_back(hooks: Sequence, trainer, run, meta: dict, groups: Dict[str, TensorDict]) -> None:
    """Each hook's own meta and groups into its ``restore_state`` (a checkpoint written before hooks had keys:
    the merged meta and every group, as then)."""
    for key, hook in zip(hook_keys(hooks), hooks):
        if PER_HOOK not in meta:
            hook.restore_state(trainer, run, meta, groups)
            continue
        prefix = group_prefix(key)
        own = ({name[len(prefix):]: t for name, t in groups.items() if name.startswith(prefix)} if prefix
               else groups)
        hook.restore_state(trainer, run, meta[PER_HOOK].get(key, {}), own)


def differing_hooks(metas: List[dict]) -> List[str]:
    """The hook keys whose meta differs between the processes' ``collect`` metas (index = rank)."""
    keys = sorted({key for meta in metas for key in meta.get(PER_HOOK, {})})
    as_text = [{key: json.dumps(meta.get(PER_HOOK, {}).get(key), sort_keys=True) for key in keys} for meta in metas]
    return [key for key in keys if any(text[key] != as_text[0][key] for text in as_text[1:])]


def group_digests(groups: Dict[str, TensorDict]) -> Dict[str, str]:
    """A sha256 of each tensor group's bytes, to compare the processes' groups without sending them."""
    digests = {}
    for name, tensors in groups.items():
        digest = hashlib.sha256()
        for key in sorted(tensors):
            digest.update(key.encode())
            digest.update(tensors[key].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        digests[name] = digest.hexdigest()
    return digests


def check_same_on_every_process(meta: dict, world_size: int, groups: Optional[Dict[str, TensorDict]] = None) -> None:
    """Raise, naming the hooks (by their meta) or tensor groups, when the processes' hook states differ (one
    all-gather of the small JSON metas and of the groups' digests; ``groups`` None: the metas only, as under FSDP,
    where each process keeps its own rows)."""
    if world_size == 1:
        return
    mine = {"meta": meta, "digests": group_digests(groups or {})}
    states: List[dict] = [{} for _ in range(world_size)]
    torch.distributed.all_gather_object(states, mine)
    differing = differing_hooks([state["meta"] for state in states])
    differing += [f"tensor group {name!r}" for name, digest in mine["digests"].items()
                  if any(state["digests"].get(name) != states[0]["digests"].get(name) for state in states)]
    if differing:
        raise ValueError(
            f"The checkpoint state of round hook(s) {differing} differs between the processes. A round checkpoint "
            "keeps one hook state, which every process restores on resume, so each process's hook must hold the "
            "same state: total what a process saw over the processes before keeping it (fedhf.sum_over_shards, "
            "fedhf.gather_over_processes; docs/round_hooks.md, \"Several processes\").")
