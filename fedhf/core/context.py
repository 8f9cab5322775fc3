"""What a client and the server see during a round; passed to every component's hooks.

A component never writes into the round's sums: its client half returns a :class:`fedhf.core.message.Message`, and its
server half reads ``ServerContext.sums``, which holds the sums of *its own* messages (the trainer hands each
component the view of its namespace, :meth:`fedhf.core.sums.RoundSums.within`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Sequence, Union

import torch

from .sums import RoundSums
from .params import TensorDict
from .client_store import ClientStateStore


@dataclass(frozen=True)
class TrainedPart:
    """Which entries of the shared tensors one client trains this round, so that a correction measures local
    progress x^r - x_i^K on those alone: a tensor that is not trained does not move, which is not a zero gradient,
    and a rank component a client zeroes is a truncation, not a step.

    * ``frozen``: tensors no client trains this round (RoLoRA's other factor, FedSVD's A).
    * ``masks``: tensors trained in part, 1.0 on the trained entries, broadcastable to the tensor (on its device)
      (``lora_client_ranks``: A[:r_i, :] and B[:, :r_i]). Every client has a mask for such a tensor (all ones for
      a client of full rank), so every client sends the same keys.

    A name in neither is trained in full.
    """

    frozen: frozenset = frozenset()
    masks: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def on_trained(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the trained entries, zero elsewhere."""
        if name in self.frozen:
            return torch.zeros_like(tensor)
        mask = self.masks.get(name)
        return tensor if mask is None else tensor * mask.to(tensor.dtype)

    def keep_untrained(self, name: str, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """``new`` on the trained entries and ``old`` elsewhere: per-client state a round did not measure stays."""
        if name in self.frozen:
            return old
        mask = self.masks.get(name)
        return new if mask is None else torch.where(mask.bool(), new, old)


class WholeTensors:
    """How one process holds a round's tensors without FSDP: whole. Under FSDP each process holds its rows (dim 0)
    of every tensor (fedhf/runtime/sharded.py's ShardedModel has the same three members): a component that needs
    a whole matrix (a factorisation) gathers it and keeps its rows of the result, and counts what is whole once."""

    rank = 0  # the process that counts what every process computes alike (bytes of a whole matrix)

    @staticmethod
    def gather(local: torch.Tensor) -> torch.Tensor:
        return local

    @staticmethod
    def local_part(whole: torch.Tensor) -> torch.Tensor:
        return whole


@dataclass
class ClientContext:
    client_id: int
    round: int
    round_lr: float  # eta_r, the round's scheduled learning rate
    local_lr: float  # what the local optimizer runs with (eta_r times the correction's lr scale)
    local_steps: int  # nominal K; normalisations divide by it (docs/algorithms.md section 5.14)
    weight: float  # w_i
    params: Dict[str, torch.nn.Parameter]  # live trainable parameters of the resident model
    global_params: TensorDict  # x^r (fp32)
    correction_state: TensorDict  # what the correction's server half broadcast this round (downloaded)
    store: ClientStateStore
    sync_state: TensorDict = field(default_factory=dict)  # Thetabar broadcast by the state-sync rule
    participants: Sequence[int] = ()  # the round's sampled clients S_r, in sampling order (all processes)
    num_clients: int = 0  # N
    trained: TrainedPart = field(default_factory=TrainedPart)  # what this client trains (default: everything)
    layout: WholeTensors = field(default_factory=WholeTensors)  # whole tensors, or this process's rows (FSDP)


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
    frozen: frozenset = frozenset()  # tensors no client trained this round (TrainedPart.frozen)
    # Per entry of a tensor trained in part (lora_client_ranks), how many of the N clients train it (>= 1).
    trainers: Mapping[str, torch.Tensor] = field(default_factory=dict)
    seed: int = 0  # the run's seed (FLoRA draws each round's A from it)

    def population(self, name: str) -> Union[int, torch.Tensor]:
        """N for the entries of ``name``: the clients that train them. A server average over all clients'
        per-client states (SCAFFOLD's c, tracking's y) divides by it, so a component is averaged over the
        clients that have it."""
        return self.trainers.get(name, self.num_clients)
