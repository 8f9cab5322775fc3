"""FedPM's preconditioned mixing (Ishii et al., AAAI 2026, arXiv 2511.09100, Eq. 8, 10, 12; docs/algorithms.md 2.10).

The ideal global step x - eta (mean_i P_i)^{-1} mean_i g_i is approached by letting each client take K steps
preconditioned by its own P_i and mixing the results with those same preconditioners:

    x^{r+1} = (sum_j w_j P_j)^{-1} sum_i w_i P_i x_i^K  =  x^r + (sum_j w_j P_j)^{-1} sum_i w_i P_i Delta_i

(the delta form, used numerically). The client's P_i come from its local optimizer's declared
:meth:`~fedhf.optim.base.OptimizerHooks.preconditioners` (no import of the optimizer here). With FOOF
(:mod:`fedhf.optim.foof`) P_i = (A_i + lambda I) acts on the right of each layer's W_aug = [W | b] (one row more
than W's inputs when the bias is folded in), so per FOOF layer

    W_aug^{r+1} = W_aug^r + [sum_i w_i Delta_aug_i (A_i + lambda I)] [sum_j w_j (A_j + lambda I)]^{-1}

and every other tensor takes the plain mean. The damping is inside P_i (the matrix the client inverts), which
keeps the mixing consensus-preserving (equal Delta_i give that Delta) and makes it FedAvg as lambda -> infinity
(docs/algorithms.md 2.10 [RESOLVED]). A_i is the FOOF matrix the client computed at the end of its round, at x_i^K.

LoRA tensors (peft's ``lora_A``/``lora_B`` linears) take the plain mean by default: FedPM was not evaluated on
LoRA, and docs/algorithms.md 6 makes FedAvg mixing the default for them; ``server_rule_kwargs.mix_lora=True`` mixes
them like any FOOF layer (their clients still step with FOOF either way). Their P is then not sent.

Both halves are sums over participants (reduce keys ``P.<weight name>`` and ``PD.<weight name>``, docs/algorithms.md
4.2), so the rule all-reduces like every other. This is the aggregator; the step is the chain's (``lr``, eta_g,
default 1, for the named ``preconditioned_mix`` rule).
"""

from __future__ import annotations

import torch

from ..core.context import ClientContext, ServerContext
from ..core.message import Message
from ..core.params import TensorDict, augment
from .base import Aggregator


def preconditioned_mix(delta_sum_P: torch.Tensor, P_sum: torch.Tensor) -> torch.Tensor:
    """[sum_i w_i Delta_i P_i] [sum_j w_j P_j]^{-1} in float64, by solving P_sum^T X^T = delta_sum_P^T."""
    P = P_sum.to(torch.float64)
    return torch.linalg.solve(P.T, delta_sum_P.to(torch.float64).T).T


def is_lora(name: str) -> bool:
    """A tensor of one of peft's LoRA adapters (``...lora_A.<adapter>.weight``, ``lora_B``, ``lora_embedding_*``)."""
    return ".lora_" in name or name.startswith("lora_")


def bias_name_of(weight_name: str) -> str:
    """An nn.Linear / nn.Conv2d names its parameters ``<module>.weight`` and ``<module>.bias``."""
    return weight_name[: -len("weight")] + "bias"


class PreconditionedMix(Aggregator):
    name = "preconditioned_mix"
    needs_preconditioners = True  # checked when the algorithm is composed, before any work

    def __init__(self, mix_lora: bool = False) -> None:
        self.mix_lora = bool(mix_lora)

    # ------------------------------------------------------------ client half
    def client_end(self, ctx: ClientContext, optimizer) -> Message:
        """P = A_i + lambda I and Delta_aug_i P per preconditioned layer, each scaled by w_i.

        Only P goes over the wire in a real deployment -- its upper triangle, in(in+1)/2 floats: the server
        forms Delta_aug_i P_i from P and Delta_i, which the client already sends as ``dx``. The simulation
        sums the products here instead, because sum_i w_i Delta_i P_i is not a product of the sums; PD is
        therefore counted as 0 bytes.
        """
        preconditioners = optimizer.preconditioners()
        if not preconditioners:
            raise ValueError(f"The preconditioned_mix server rule (FedPM) mixes with the local optimizer's "
                             f"preconditioners, but {type(optimizer).__name__} exports none: set "
                             "`local_optimizer=\"foof\"`, or choose another `server_rule`.")
        message = Message()
        for weight_name, P in preconditioners.items():
            if is_lora(weight_name) and not self.mix_lora:
                continue  # averaged like any non-FOOF tensor
            delta = ctx.params[weight_name].detach().double() - ctx.global_params[weight_name].double()
            bias_name = bias_name_of(weight_name)
            folded = P.shape[0] == delta[0].numel() + 1  # the homogeneous coordinate: the layer's bias
            bias_delta = (ctx.params[bias_name].detach().double() - ctx.global_params[bias_name].double()
                          if folded else None)
            n = P.shape[0]
            message.put("P", {weight_name: P}, scale=ctx.weight, nbytes=n * (n + 1) // 2 * 4)
            message.put("PD", {weight_name: augment(delta, bias_delta) @ P}, scale=ctx.weight, nbytes=0)
        return message

    # ------------------------------------------------------------ server half
    def aggregate(self, ctx: ServerContext) -> TensorDict:
        sums, x = ctx.sums, ctx.global_params
        # (no P at all -- a LoRA-only model without mix_lora -- is FedAvg)
        layers = sorted(key[len("P."):] for key in sums.keys() if key.startswith("P."))
        direction = dict(ctx.mean_delta)  # non-FOOF and LoRA tensors: the plain mean
        for weight_name in layers:
            W = x[weight_name]
            step = preconditioned_mix(sums.get(f"PD.{weight_name}"), sums.get(f"P.{weight_name}"))
            cols = W[0].numel()
            direction[weight_name] = step[:, :cols].reshape(W.shape).to(W)
            if step.shape[1] == cols + 1:  # the homogeneous coordinate: the layer's bias
                bias_name = bias_name_of(weight_name)
                if bias_name not in x:
                    raise ValueError(f"FOOF layer {weight_name!r} has a folded bias but {bias_name!r} is not a "
                                     "trainable tensor of the global model.")
                direction[bias_name] = step[:, cols].to(x[bias_name])
        return direction
