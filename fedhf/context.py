"""What a client and the server see during a round; passed to the corrections and server rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

import torch

from .aggregation import RoundSums
from .params import TensorDict, num_bytes
from .state.store import ClientStateStore


@dataclass
class ClientContext:
    client_id: int
    round: int
    round_lr: float  # eta_r, the round's scheduled learning rate
    local_lr: float  # what the local optimizer runs with (eta_r times the correction's lr scale)
    local_steps: int  # nominal K; normalisations divide by it (ALGORITHMS.md section 5.14)
    weight: float  # w_i
    params: Dict[str, torch.nn.Parameter]  # live trainable parameters of the resident model
    global_params: TensorDict  # x^r (fp32)
    server_state: TensorDict  # what the server broadcast this round (downloaded)
    store: ClientStateStore
    sums: RoundSums
    uplink_bytes: int = 0
    scratch: Dict[str, object] = field(default_factory=dict)  # per-client-round values a correction keeps

    def send(self, prefix: str, tensors: TensorDict, scale: float = 1.0) -> None:
        """Upload ``tensors`` (their bytes are counted) as ``scale * tensors`` into the round's sums."""
        self.uplink_bytes += num_bytes(tensors)
        self.sums.add_tensors(prefix, tensors, scale)


@dataclass
class ServerContext:
    round: int
    round_lr: float
    local_steps: int
    num_clients: int  # N, the whole population (SCAFFOLD and tracking divide by it)
    sums: RoundSums
    global_params: TensorDict  # x^r, before the update
    mean_delta: TensorDict  # D = sum w_i Delta_i / sum w_i
