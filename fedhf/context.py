"""What a client and the server see during a round; passed to every component's hooks.

A component never writes into the round's sums: its client half returns a :class:`fedhf.message.Message`, and its
server half reads ``ServerContext.sums``, which holds the sums of *its own* messages (the trainer hands each
component the view of its namespace, :meth:`fedhf.aggregation.RoundSums.within`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import torch

from .aggregation import RoundSums
from .params import TensorDict
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
    correction_state: TensorDict  # what the correction's server half broadcast this round (downloaded)
    store: ClientStateStore
    sync_state: TensorDict = field(default_factory=dict)  # Thetabar broadcast by the state-sync rule
    participants: Sequence[int] = ()  # the round's sampled clients S_r, in sampling order (all processes)
    num_clients: int = 0  # N
    scratch: Dict[str, object] = field(default_factory=dict)  # per-client-round values a correction keeps


@dataclass
class ServerContext:
    round: int
    round_lr: float
    local_steps: int
    num_clients: int  # N, the whole population (SCAFFOLD and tracking divide by it)
    sums: RoundSums  # the sums of the reading component's own messages
    global_params: TensorDict  # x^r, before the update
    mean_delta: TensorDict  # D = sum w_i Delta_i / sum w_i
    gathered: List[TensorDict] = field(default_factory=list)  # each Delta_i in client order, if the aggregator gathers
    seed: int = 0  # the run's seed (FLoRA draws each round's A from it)
