"""Round checkpoints of a run sharded with FSDP (fedhf/runtime/sharded.py): every process's rows of every tensor.

Under FSDP each process holds its own rows (dim 0) of the run's tensors: the global model, server, correction and
sync state, the best round and every client's stored state. A round checkpoint keeps them as they are, one file
per group and process (``<group>@rank<K>.safetensors``, written into the same atomic, checksummed folder as any
checkpoint by process 0, which receives the other processes' rows), and ``meta["fsdp_processes"]`` says how many
there were. A resumed run takes back its own rows; it must have as many processes (the rows of each tensor depend
on the count), and a checkpoint of a sharded run cannot resume an unsharded one or the reverse.
"""

from __future__ import annotations

from typing import Dict

import torch

from ..core.params import TensorDict

META_KEY = "fsdp_processes"


def _name(group: str, rank: int) -> str:
    return f"{group}@rank{rank}"


def every_process_groups(groups: Dict[str, TensorDict], rank: int, size: int) -> Dict[str, TensorDict]:
    """Every process's ``groups``, each renamed ``<group>@rank<K>``, on process 0 (``{}`` elsewhere): one gather of
    CPU tensors between the run's own processes."""
    mine = {_name(group, rank): {k: v.detach().cpu() for k, v in tensors.items()} for group, tensors in groups.items()}
    parts = [None] * size if rank == 0 else None
    torch.distributed.gather_object(mine, parts, dst=0)
    return {name: tensors for part in parts for name, tensors in part.items()} if rank == 0 else {}


def own_groups(path: str, groups: Dict[str, TensorDict], meta: dict, rank: int, size: int,
               sharded: bool) -> Dict[str, TensorDict]:
    """This process's groups of a checkpoint (all of them when it was written unsharded); refuses a checkpoint
    written by another number of FSDP processes, or a sharded one resumed unsharded (and the reverse)."""
    written = meta.get(META_KEY)
    if written is None and not sharded:
        return groups
    if written is None or not sharded or written != size:
        wrote = f"{written} FSDP processes" if written else "a run without FSDP"
        now = f"{size} FSDP processes" if sharded else "without FSDP"
        raise ValueError(f"{path} was written by {wrote}, and this run has {now}: each process's rows of every "
                         f"tensor depend on that. Resume it with the launch that wrote it.")
    suffix = f"@rank{rank}"
    return {name[:-len(suffix)]: tensors for name, tensors in groups.items() if name.endswith(suffix)}
