"""Everything a federated run carries from one round to the next, and its checkpoint form.

Nothing else is needed to resume bit for bit: client sampling, data order, dropout and every other random
draw come from (seed, round, client) streams (:mod:`fedhf.schedule`); optimizer state that outlives a round is
either the broadcast Thetabar (``sync_state``) or per-client state in the client store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

from ..params import TensorDict

#: Config fields that must match between a checkpoint and the run resuming from it.
FINGERPRINT_FIELDS = ("num_clients", "clients_per_round", "num_rounds", "local_steps", "seed", "partition",
                      "partition_column", "dirichlet_alpha", "client_weighting", "round_lr_schedule",
                      "per_device_train_batch_size", "max_grad_norm")

GROUPS = ("global_params", "global_buffers", "server_state", "correction_state", "sync_state")


@dataclass
class RunState:
    global_params: TensorDict
    global_buffers: TensorDict
    server_state: TensorDict
    correction_state: TensorDict
    sync_state: TensorDict = field(default_factory=dict)  # Thetabar of average_warmstart / compressed_average
    rounds_done: int = 0
    uplink_bytes: float = 0.0
    downlink_bytes: float = 0.0
    losses: List[float] = field(default_factory=list)

    def tensor_groups(self) -> Dict[str, TensorDict]:
        return {name: getattr(self, name) for name in GROUPS}

    def meta(self) -> dict:
        return {"rounds_done": self.rounds_done, "uplink_bytes": self.uplink_bytes,
                "downlink_bytes": self.downlink_bytes, "losses": self.losses}

    @classmethod
    def from_checkpoint(cls, groups: Dict[str, TensorDict], meta: dict) -> "RunState":
        return cls(**{name: groups.get(name, {}) for name in GROUPS}, rounds_done=meta["rounds_done"],
                   uplink_bytes=meta["uplink_bytes"], downlink_bytes=meta["downlink_bytes"],
                   losses=list(meta["losses"]))


def fingerprint(args, algorithm) -> dict:
    return {"algorithm": algorithm.describe(), **{name: getattr(args, name) for name in FINGERPRINT_FIELDS}}
