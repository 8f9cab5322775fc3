"""What a client and the server see during a round; passed to the corrections and server rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

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
    server_state: TensorDict  # what the correction's server half broadcast this round (downloaded)
    store: ClientStateStore
    sums: RoundSums
    sync_state: TensorDict = field(default_factory=dict)  # Thetabar broadcast by the state-sync rule
    participants: Sequence[int] = ()  # the round's sampled clients S_r, in sampling order (all processes)
    num_clients: int = 0  # N
    uplink_bytes: int = 0
    scratch: Dict[str, object] = field(default_factory=dict)  # per-client-round values a correction keeps

    def send(self, prefix: str, tensors: TensorDict, scale: float = 1.0, nbytes: Optional[int] = None) -> None:
        """Upload ``tensors`` as ``scale * tensors`` into the round's sums. Their bytes are counted, or ``nbytes``
        when what would go over the wire is smaller than the dense tensors summed here (a low-rank factorisation,
        the upper triangle of a symmetric matrix)."""
        self.uplink_bytes += num_bytes(tensors) if nbytes is None else int(nbytes)
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
