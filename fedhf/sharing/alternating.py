"""Alternating LoRA factors (``parameter_sharing="rolora"``): RoLoRA (Chen, Guo, Ju, Dalal, Zhu, Khisti, NeurIPS
2025, "Robust Federated Finetuning of LLMs via Alternating Optimization of LoRA", arXiv:2502.01755).

RoLoRA alternates which LoRA factor the clients learn: with A fixed the clients update B and the server averages
B; then with B fixed they update A and the server averages A. With one factor fixed and shared by every client,
the mean of the clients' products is the product of the means (mean_i B_i A = Bbar A), so plain averaging is
exact, and each round sends half of the adapter. Here one fedhf round is one such half-step:

* even rounds (0, 2, ...): B is trained and sent, A is frozen (``requires_grad`` off, not in the optimizer);
* odd rounds: A is trained and sent, B is frozen.

B first because peft initialises B = 0, which makes A's gradient zero: a first A round would learn nothing.
Both factors stay shared tensors of the federated model (one set of names for every round, so server, correction
and optimizer-sync state keep their keys); the frozen factor's model change is exactly zero, is not counted in the
uplink (a deployment would not send it), and the server keeps it as it was even if its rule carries momentum.
The rest of the round (downlink, correction and state-sync messages) is counted as for any shared tensor.

The same mechanism with A frozen in *every* round (``alternate=False``) is the client half of FedSVD
(:class:`fedhf.server.lora.FedSVD`): clients train only B, and A changes only on the server, which sets it.
"""

from __future__ import annotations

from typing import Dict, Mapping

import torch

from ..core.lora import LORA_A, LORA_B, role_of
from ..core.params import TensorDict, num_bytes
from ..core.theta import split_theta_key

ROLORA = "rolora"


class AlternatingFactors:
    """Which factor is frozen in the current round, over the plan's shared parameters."""

    def __init__(self, params: Dict[str, torch.nn.Parameter], alternate: bool = True) -> None:
        self.params, self.alternate = params, alternate
        self.by_role = {role: [n for n in params if role_of(n) == role] for role in (LORA_A, LORA_B)}
        self.frozen: frozenset = frozenset()

    def frozen_in(self, round_index: int):
        return self.by_role[LORA_A] if round_index % 2 == 0 or not self.alternate else self.by_role[LORA_B]

    def begin_round(self, round_index: int) -> None:
        self.frozen = frozenset(self.frozen_in(round_index))
        for name in self.frozen:
            self.params[name].requires_grad_(False)

    def end_round(self) -> None:
        """Both factors trainable again between rounds (as the user's model was)."""
        for name in self.frozen:
            self.params[name].requires_grad_(True)
        self.frozen = frozenset()

    def trained(self, shared: Dict[str, torch.nn.Parameter]) -> Dict[str, torch.nn.Parameter]:
        return {n: p for n, p in shared.items() if n not in self.frozen}

    def sent_bytes(self, delta: TensorDict) -> int:
        """The uplink of the model change: the trained tensors only."""
        return num_bytes({n: t for n, t in delta.items() if n not in self.frozen})

    def without_frozen(self, optimizer) -> "TrainedTheta":
        return TrainedTheta(optimizer, self.frozen)

    def hold(self, new_params: TensorDict, old_params: TensorDict) -> TensorDict:
        """The server's result with the frozen factor as it was (bit for bit); FedSVD's server sets A itself."""
        if not self.alternate:
            return new_params
        return {n: old_params[n] if n in self.frozen else t for n, t in new_params.items()}


class TrainedTheta:
    """The optimizer as the state sync's warm start sees it: Theta entries of the frozen factor (synced or kept in
    an earlier round, when that factor trained) are left out, since its tensors are not in this round's
    optimizer; the trained factor's are imported as usual."""

    def __init__(self, optimizer, frozen: frozenset) -> None:
        self.optimizer, self.frozen = optimizer, frozen

    def import_theta(self, theta: Mapping[str, torch.Tensor]) -> None:
        self.optimizer.import_theta({k: v for k, v in theta.items() if split_theta_key(k)[1] not in self.frozen})
