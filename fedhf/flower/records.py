"""fedhf's tensors as Flower records, bit for bit.

Flower's :class:`~flwr.app.ArrayRecord` carries numpy arrays; a tensor crosses as ``tensor.numpy()`` and comes back
with ``torch.from_numpy``, which is exact for every dtype numpy has. bfloat16 (which numpy lacks) crosses as its raw
16 bits (``view(torch.int16)``), its key listed in the record's ``ConfigRecord`` of reinterpreted keys, so nothing is
rounded on the way. Groups of tensors (the run's ``global_params``, ``sync_state``, ...) share one record with keys
``<group>/<name>``.
"""

from __future__ import annotations

from typing import Dict, Iterable, Mapping, Tuple

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord

from ..core.params import TensorDict
from ..core.sums import RoundSums

RAW_BF16 = "bf16"  # ConfigRecord key: the ArrayRecord keys that hold bfloat16 bits as int16
GATHERED = "gathered/"  # a client's update kept for a robust aggregator (RoundSums.gather), per tensor


def to_record(tensors: Mapping[str, torch.Tensor]) -> Tuple[ArrayRecord, ConfigRecord]:
    """Tensors as an ArrayRecord and the ConfigRecord naming the ones stored as raw bfloat16 bits."""
    arrays, raw = {}, []
    for key, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:
            tensor, raw = tensor.view(torch.int16), raw + [key]
        arrays[key] = Array(tensor.numpy())  # contiguous; np.ascontiguousarray would make a 0-d tensor 1-d
    return ArrayRecord(arrays), ConfigRecord({RAW_BF16: raw})


def from_record(arrays: ArrayRecord, config: ConfigRecord, device="cpu") -> TensorDict:
    raw = set(config.get(RAW_BF16, []) or [])
    out = {}
    for key, array in arrays.items():
        tensor = torch.from_numpy(array.numpy().copy())
        out[key] = (tensor.view(torch.bfloat16) if key in raw else tensor).to(device)
    return out


def flatten_groups(groups: Mapping[str, TensorDict]) -> TensorDict:
    return {f"{group}/{name}": t for group, tensors in groups.items() for name, t in tensors.items()}


def unflatten_groups(flat: Mapping[str, torch.Tensor], names: Iterable[str]) -> Dict[str, TensorDict]:
    groups: Dict[str, TensorDict] = {name: {} for name in names}
    for key, tensor in flat.items():
        group, name = key.split("/", 1)
        groups.setdefault(group, {})[name] = tensor
    return groups


def sums_tensors(sums: RoundSums) -> TensorDict:
    """One client's round sums (float64, as the trainer added them) and the update it kept for gathering."""
    flat = dict(sums.items())
    for _, update in sums.gathered:
        flat.update({GATHERED + name: t for name, t in update.items()})
    return flat


def add_client_sums(total: RoundSums, client_id: int, flat: Mapping[str, torch.Tensor]) -> None:
    """One client's sums into the round's, as the simulation adds that client's messages: each key is added once
    per client (float64 + float64, the same addition in the same client order, so the totals are identical)."""
    update = {}
    for key, tensor in flat.items():
        if key.startswith(GATHERED):
            update[key[len(GATHERED):]] = tensor
        else:
            total.add(key, tensor)
    if update:
        total.gather(client_id, update)
