"""Per-client persistent state (SCAFFOLD c_i, tracking terms, cached curvature), keyed by client id.

Only clients that need state ever get an entry, and an entry holds only the tensors the algorithm keeps, so
the memory cost is (clients that participated) x (state size). State lives in memory up to ``budget_bytes``;
beyond it, the least recently used clients are written to ``spill_dir`` as safetensors and read back on
demand, so 10,000 clients cost disk rather than memory. The memory is the model's device (GPU memory on a GPU):
an entry is kept where the tensors it was made from live, and a spilled or restored entry is read back to
``device``, the model's.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from typing import Dict, Optional, Tuple, Union

import torch
from safetensors.torch import load_file, save_file

from .params import TensorDict, num_bytes

Key = Tuple[int, str]


class ClientStateStore:
    def __init__(self, budget_bytes: Optional[int] = None, spill_dir: Optional[str] = None,
                 device: Union[torch.device, str] = "cpu") -> None:
        self.budget_bytes = budget_bytes
        self._spill_dir = spill_dir
        self.device = torch.device(device)
        self._memory: "OrderedDict[Key, TensorDict]" = OrderedDict()
        self._on_disk: Dict[Key, str] = {}
        self.resident_bytes = 0

    def get(self, client_id: int, name: str) -> Optional[TensorDict]:
        key = (int(client_id), name)
        if key in self._memory:
            self._memory.move_to_end(key)
            return self._memory[key]
        if key in self._on_disk:
            path = self._on_disk.pop(key)
            tensors = load_file(path, device=str(self.device))
            os.remove(path)  # back in memory; a later spill writes it again
            self._keep(key, tensors)
            return tensors
        return None

    def put(self, client_id: int, name: str, tensors: TensorDict) -> None:
        """Keep ``tensors`` as the client's ``name``; an empty dict is no state (forgotten), as a checkpoint, which
        stores tensors, would have it."""
        key = (int(client_id), name)
        self._forget(key)
        if tensors:
            self._keep(key, {k: v.detach().contiguous() for k, v in tensors.items()})

    def to_tensors(self) -> TensorDict:
        """Every entry as one flat dict keyed ``"<client>/<name>/<tensor>"`` (for checkpoints)."""
        out = {}
        for client_id, name in sorted(set(self._memory) | set(self._on_disk)):
            tensors = self._memory.get((client_id, name))
            if tensors is None:
                tensors = load_file(self._on_disk[(client_id, name)])
            out.update({f"{client_id}/{name}/{k}": v for k, v in tensors.items()})
        return out

    def load_tensors(self, flat: TensorDict, keep=lambda client_id: True) -> None:
        """Replace the contents with ``to_tensors()`` output, keeping only the clients ``keep`` accepts."""
        for key in list(self._memory) + list(self._on_disk):
            self._forget(key)
        grouped: Dict[Key, TensorDict] = {}
        for flat_key, tensor in flat.items():
            client_id, name, tensor_name = flat_key.split("/", 2)
            if keep(int(client_id)):
                grouped.setdefault((int(client_id), name), {})[tensor_name] = tensor.to(self.device)
        for (client_id, name), tensors in grouped.items():
            self.put(client_id, name, tensors)

    def clients(self) -> set:
        """The ids of the clients with an entry, in memory or spilled."""
        return {client_id for client_id, _ in list(self._memory) + list(self._on_disk)}

    def __len__(self) -> int:
        return len(self._memory) + len(self._on_disk)

    def _forget(self, key: Key) -> None:
        if key in self._memory:
            self.resident_bytes -= num_bytes(self._memory.pop(key))
        path = self._on_disk.pop(key, None)
        if path is not None and os.path.exists(path):
            os.remove(path)

    def _keep(self, key: Key, tensors: TensorDict) -> None:
        self._memory[key] = tensors
        self.resident_bytes += num_bytes(tensors)
        while self.budget_bytes is not None and self.resident_bytes > self.budget_bytes and len(self._memory) > 1:
            self._spill(next(iter(self._memory)))

    def _spill(self, key: Key) -> None:
        if self._spill_dir is None:
            self._spill_dir = tempfile.mkdtemp(prefix="fedhf-client-state-")
        os.makedirs(self._spill_dir, exist_ok=True)
        tensors = self._memory.pop(key)
        self.resident_bytes -= num_bytes(tensors)
        path = os.path.join(self._spill_dir, f"client{key[0]}-{key[1]}.safetensors")
        save_file(tensors, path)
        self._on_disk[key] = path
