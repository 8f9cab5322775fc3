"""LoRA aggregation rules that aggregate the clients' products B_i A_i, not A and B apart.

* ``fedex_lora``: FedEx-LoRA (Singhal, Ponkshe, Vepakomma, NAACL 2025, "Exact Aggregation for Federated and
  Efficient Fine-Tuning of Foundation Models", arXiv:2410.09432), below.
* ``flora``: FLoRA (Wang et al., NeurIPS 2024, "FLoRA: Federated Fine-Tuning Large Language Models with Heterogeneous
  Low-Rank Adaptations", arXiv:2409.05976): the stacked adapters [B_1 ... B_n][p_1 A_1; ...; p_n A_n] =
  sum_i p_i B_i A_i are merged into the base and every client starts the next round from a fresh adapter (B = 0, A
  redrawn from the run's seed and the round). The stack's product is a sum, so it is sent as one.
* ``flexlora``: FlexLoRA (Bai et al., NeurIPS 2024, "Federated Fine-tuning of Large Language Models under
  Heterogeneous Tasks and Client Resources", arXiv:2402.11505): the server re-factorises M = sum_i p_i B_i A_i by SVD,
  M = U S V^T, to the adapter's rank r: B = U_r S_r^(1/2), A = S_r^(1/2) V_r^T (the rows of V^T, not of V as
  FedLLM-Factory's FedSVD takes). Exact when r >= rank M (e.g. full-rank adapters); otherwise the best rank-r
  approximation, with nothing folded into the base. Clients share one rank here (heterogeneous ranks: not built).
* ``fedsvd``: FedSVD (Lee et al., NeurIPS 2025, "FedSVD: Adaptive Orthogonalization for Private Federated Learning
  with LoRA", arXiv:2505.12805): clients train and send only B (A is frozen on every client, as in FFA-LoRA, but
  not fixed); the server averages B and re-factorises the product with the previous A by SVD,
  Bbar A = U S V^T, to A' = V_r^T (orthonormal rows: the first r rows of V^T, not of V) and B' = U_r S_r. As
  rank(Bbar A) <= r this is exact, B' A' = Bbar A = sum_i p_i B_i A, so the global effective weight is the mean of
  the clients'; nothing is folded into the base, and the upload is dB alone (the authors' code, seanie12/fed-svd,
  refactorises every ``recalculate_svd_period`` rounds; here every round).

Averaging A and B separately is not averaging the clients' updates: mean_i B_i A_i != Bbar Abar. FedEx-LoRA keeps
the averaged adapter and folds the difference into the frozen base weight of each adapted layer,

    W' = W + s (sum_i p_i B_i A_i - B' A'),     s = lora_alpha / r  (peft's ``scaling``),

so the global effective weight W' + s B' A' equals the weighted mean of the clients' effective weights
W + s B_i A_i exactly (p_i = w_i / sum w). The residual is taken against the adapter the whole chain produced
(B', A'; with the plain ``lr`` = 1 step these are Bbar, Abar), so the identity holds for any transform chain.
Unlike FedLLM-Factory's version, the residual is scaled by s, and B A is (out x in) like the base weight, so
nothing is transposed.

What is sent, counted as a deployment would send it: each client uploads its dA, dB, as under FedAvg, and the
server forms B_i A_i from them (B_i = B + dB_i, A_i = A + dA_i). The simulation moves w_i B_i A_i as a dense fp32
(out x in) matrix per adapted layer because its aggregation is a sum (one all-reduce, no gathering), but that matrix
is not counted in the uplink. The server broadcasts the dense residual with the next round's model; the trainer
counts it dense in the downlink, which overstates it where its factors are smaller: the residual has rank <= (n + 1) r
(FLoRA's merged product <= n r), so when (n + 1) r (in + out) < in out -- 4x on MiniLM with 5 clients at r 8 -- a
deployment would send factors. The base weights a run has changed are kept in the run's state
(``RunState.base_params``) and checkpointed, so resume is exact; a peft adapter alone does not carry them, so the
saved and pushed model of a folding rule is the full model with the adapter merged
(:meth:`fedhf.trainer.FederatedTrainer.published_model`). Folding needs base weights that are plain floating-point
tensors of their own: a quantised base or a tied weight is refused before any work
(:func:`fedhf.runtime.lora_layers.check_foldable`). The aggregator itself only sees named tensors; which base weight and scale
belong to which A (:func:`fedhf.runtime.lora_layers.lora_layers`) is the trainer's (:class:`fedhf.runtime.lora_layers.BaseFold`).
"""

from __future__ import annotations

from typing import Dict

import torch

from ..core.context import ClientContext, ServerContext
from ..core.lora import lora_pairs, seeded_lora_a
from ..core.message import Message
from ..core.params import TensorDict
from ..core.schedule import stream_seed
from .base import Aggregator


class ProductAggregator(Aggregator):
    """The client half these rules share: the clients' weighted products, as a sum."""

    needs_lora_pairs = True
    sends_products = True

    def client_end(self, ctx: ClientContext, optimizer) -> Message:
        """w_i B_i A_i per adapted layer, keyed by the name of A. Not counted in the uplink (``nbytes=0``): a server
        forms it from what the client already sends, B_i = B + dB_i and A_i = A + dA_i, as the papers' servers do;
        it travels dense here only because the simulated aggregation is a sum."""
        products = {a: ctx.params[b].detach().float() @ ctx.params[a].detach().float()
                    for a, b in lora_pairs(ctx.global_params).items()}
        return Message().put("BA", products, scale=ctx.weight, nbytes=0).put_scalar("w", ctx.weight)

    @staticmethod
    def mean_product(ctx: ServerContext, a: str) -> torch.Tensor:
        return ctx.sums.get(f"BA.{a}") / ctx.sums.scalar("w")


class FedExLoRA(ProductAggregator):
    """D = the weighted mean of the updates (A and B averaged as FedAvg does), plus the product residual."""

    name = "fedex_lora"
    folds_into_base = True

    def aggregate(self, ctx: ServerContext) -> TensorDict:
        return dict(ctx.mean_delta)

    def base_residual(self, new_params: TensorDict, ctx: ServerContext) -> Dict[str, torch.Tensor]:
        """sum_i p_i B_i A_i - B' A' per A name (unscaled; the trainer's BaseFold applies s), in float64."""
        return {a: self.mean_product(ctx, a) - new_params[b].double() @ new_params[a].double()
                for a, b in lora_pairs(new_params).items()}


class FLoRA(FedExLoRA):
    """The whole mean product goes into the base; the adapter restarts (B = 0, A drawn from the round)."""

    name = "flora"
    refactorises_lora = True

    def aggregate(self, ctx: ServerContext) -> TensorDict:
        direction, x = dict(ctx.mean_delta), ctx.global_params
        # The round's A depends on the run's seed (each seed its own sequence of A); 32 bits, as a run's seed.
        round_seed = stream_seed(ctx.seed, ctx.round + 1) % 2**32
        for index, (a, b) in enumerate(lora_pairs(x).items()):
            direction[a] = seeded_lora_a(x[a].shape, round_seed, index).to(x[a]) - x[a]  # x's dtype and device
            direction[b] = -x[b]
        return direction


class FlexLoRA(ProductAggregator):
    """A and B re-factorised from the SVD of the mean product, at the adapter's rank."""

    name = "flexlora"
    refactorises_lora = True

    def aggregate(self, ctx: ServerContext) -> TensorDict:
        direction, x = dict(ctx.mean_delta), ctx.global_params
        for a, b in lora_pairs(x).items():
            U, S, Vh = torch.linalg.svd(self.mean_product(ctx, a), full_matrices=False)
            r, root = x[a].shape[0], S[: x[a].shape[0]].sqrt()
            direction[b] = (U[:, :r] * root).to(x[b].dtype) - x[b]
            direction[a] = (root[:, None] * Vh[:r]).to(x[a].dtype) - x[a]
        return direction


class FedSVD(Aggregator):
    """B averaged, then B A re-factorised by SVD: A gets the orthonormal right singular vectors, B the rest."""

    name = "fedsvd"
    needs_lora_pairs = True
    freezes_lora_a = True  # the trainer's sharing plan keeps A out of every client's training
    refactorises_lora = True

    def aggregate(self, ctx: ServerContext) -> TensorDict:
        direction, x = dict(ctx.mean_delta), ctx.global_params
        for a, b in lora_pairs(x).items():
            product = (x[b].double() + ctx.mean_delta[b].double()) @ x[a].double()  # Bbar A, (out x in)
            U, S, Vh = torch.linalg.svd(product, full_matrices=False)
            r = x[a].shape[0]
            direction[b] = (U[:, :r] * S[:r]).to(x[b].dtype) - x[b]
            direction[a] = Vh[:r].to(x[a].dtype) - x[a]
        return direction
