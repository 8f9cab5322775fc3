"""What the server rule's aggregator declares it needs of the round, built once into objects the trainer holds
(as peft builds a LoRA variant once from its config), so the round never asks the aggregator's flags:

* ``gathers`` -> :class:`UpdateGathering` (robust aggregators read every client's update, not only the sums) or
  :class:`NoGathering`;
* ``folds_into_base`` -> :class:`fedhf.runtime.lora_layers.BaseFold` over the adapted layers (FedEx-LoRA, FLoRA),
  or one over no layer, which folds and loads nothing;
* ``freezes_lora_a`` -> the sharing plan's frozen factor (FedSVD: A is the server's; fedhf/sharing/alternating.py).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..core.params import TensorDict
from ..core.sums import RoundSums
from ..runtime.lora_layers import BaseFold


class NoGathering:
    """The aggregator reads sums only: nothing kept per client, and the all-reduce carries the sums alone."""

    keeps_updates = False

    def keep(self, sums: RoundSums, client_id: int, delta: TensorDict) -> None:
        pass

    def all_reduce(self, sums: RoundSums, device: Optional[torch.device]) -> None:
        sums.all_reduce(device=device)


class UpdateGathering(NoGathering):
    """Each client's Delta_i kept beside the sums and shared with every process (median, trimmed mean, Krum...)."""

    keeps_updates = True

    def keep(self, sums: RoundSums, client_id: int, delta: TensorDict) -> None:
        sums.gather(client_id, delta)

    def all_reduce(self, sums: RoundSums, device: Optional[torch.device]) -> None:
        sums.all_reduce(gather=True, device=device)


def gathering(aggregator) -> NoGathering:
    return UpdateGathering() if aggregator.gathers else NoGathering()


def base_fold(model: torch.nn.Module, aggregator) -> BaseFold:
    return BaseFold(model, aggregator.folds_into_base)
