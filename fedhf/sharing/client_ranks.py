"""Heterogeneous LoRA ranks per client (``lora_client_ranks=[r_1, ..., r_N]``), as FlexLoRA (Bai et al., NeurIPS
2024, arXiv:2402.11505) and FLoRA (Wang et al., NeurIPS 2024, arXiv:2409.05976) use them: client i, with fewer
resources, trains a rank-r_i adapter.

The design (one resident model, one global rank-r adapter): client i trains the first r_i rank components of the
global adapter, A[:r_i, :] and B[:, :r_i]; the rest is zeroed when it starts and again after every local step
(after the correction's hooks, so no optimizer or correction can revive it). Its adapter B_i A_i therefore has
rank <= r_i. The product rules then aggregate the products, which is what makes mixed ranks meaningful:

* FlexLoRA re-factorises the mean product M = U S V^T to the global rank r with B = U_r S_r^(1/2),
  A = S_r^(1/2) V_r^T, components ordered by singular value; client i's truncation to the first r_i of them is
  B_i A_i = U_{r_i} S_{r_i} V_{r_i}^T, the best rank-r_i approximation of M: FlexLoRA's per-client
  re-factorisation to each client's rank.
* FLoRA stacks the clients' adapters of any ranks: sum_i p_i B_i A_i is merged into the base, so the global
  effective weight stays the exact mean of the clients' (tested).
* FedEx-LoRA and FedSVD also aggregate exactly from the products; averaging A and B separately (``mean``) would
  average zeros into the components a client lacks, so it is refused.

Corrections (SCAFFOLD, global mixing, parameter tracking) estimate gradients from x^r - x_i^K, where a
truncation would read as a huge step: each client's context carries its mask (:meth:`ClientRanks.masks`), so a
correction measures and shifts only the components the client trains and averages each component over the clients
that train it (:meth:`ClientRanks.trainers`). A state sync that averages the clients' optimizer state is refused
(a client's state is zero on the components it lacks).

With every r_i = r nothing is truncated: the run is the one without the setting, bit for bit (tested). The
uplink still counts the rank-r tensors (an upper bound: a rank-r_i client would send r_i rows/columns).
"""

from __future__ import annotations

from typing import Dict, Sequence

import torch

from ..core.lora import lora_pairs


class ClientRanks:
    """Zeroes the components beyond a client's rank in the resident adapter, and tells the corrections which
    components a client trains (:meth:`masks`) and how many clients train each (:meth:`trainers`)."""

    def __init__(self, ranks: Sequence[int], params: Dict[str, torch.nn.Parameter]) -> None:
        self.ranks = [int(r) for r in ranks]
        self.pairs = {params[a]: params[b] for a, b in lora_pairs(params).items()}
        # the (A, B) names, rank and device of the layers some client truncates: masks and counts live on the
        # device of the tensors they describe (a CUDA op takes no CPU tensor of shape (r, 1))
        self._truncated = {(a, b): (params[a].shape[0], params[a].device) for a, b in lora_pairs(params).items()
                           if min(self.ranks) < params[a].shape[0]}
        counts = {pair: sum(self._components(r, *layer) for r in self.ranks) for pair, layer in self._truncated.items()}
        # a component no client trains gets 1: nothing is added to it, and nothing is divided by zero
        self._trainers = self._by_name({pair: c.clamp(min=1.0) for pair, c in counts.items()})

    @staticmethod
    def _components(r: int, rank: int, device: torch.device) -> torch.Tensor:
        return (torch.arange(rank, device=device) < r).float()

    @staticmethod
    def _by_name(per_pair: Dict[tuple, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """A per-component vector as A's (r x 1) and B's (1 x r) broadcastable shapes."""
        out = {}
        for (a, b), v in per_pair.items():
            out[a], out[b] = v[:, None], v[None, :]
        return out

    def masks(self, client_id: int) -> Dict[str, torch.Tensor]:
        """1.0 on the components client i trains, for every layer some client truncates (all ones at full rank)."""
        r = self.ranks[client_id]
        return self._by_name({pair: self._components(r, *layer) for pair, layer in self._truncated.items()})

    def trainers(self) -> Dict[str, torch.Tensor]:
        """How many of the N clients train each component of a truncated layer (for ServerContext.trainers)."""
        return self._trainers

    def rank_of(self, client_id: int) -> int:
        return self.ranks[client_id]

    @torch.no_grad()
    def truncate(self, client_id: int) -> None:
        """A[r_i:, :] = 0 and B[:, r_i:] = 0 on every adapted layer (nothing when r_i is the adapter's rank)."""
        r = self.ranks[client_id]
        for a, b in self.pairs.items():
            if r < a.shape[0]:
                a[r:].zero_()
                b[:, r:].zero_()
