"""Pure update functions shared by the local optimizers and the server transforms, so a rule that exists on both
sides is written once (the design notes' warning against re-coding client math on the server, as Flower does).

Each updates its state tensors in place and returns nothing; the caller forms its direction from them. A server
transform calls them on copies of its state (its state is a value between rounds).
"""

from __future__ import annotations

import torch

SECOND_MOMENTS = ("adam", "yogi", "adagrad")


@torch.no_grad()
def adaptive_moments_(grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, beta1: float, beta2: float,
                      kind: str = "adam") -> None:
    """m <- b1 m + (1 - b1) g and the second moment of ``kind`` (Reddi et al., 2021, Algorithm 2):
    adam: v <- b2 v + (1 - b2) g^2 ; yogi: v <- v - (1 - b2) g^2 sign(v - g^2) ; adagrad: v <- v + g^2.
    No bias correction (local AMSGrad of FAdam / FedLADA, server FedAdam / FedYogi / FedAdagrad)."""
    m.mul_(beta1).add_(grad, alpha=1 - beta1)
    if kind == "adam":
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    elif kind == "yogi":
        sq = grad * grad
        v.sub_((1 - beta2) * sq * torch.sign(v - sq))
    elif kind == "adagrad":
        v.addcmul_(grad, grad)
    else:
        raise ValueError(f"Unknown second moment {kind!r}; choose one of {SECOND_MOMENTS}.")


@torch.no_grad()
def covariance_moments_(grad: torch.Tensor, m: torch.Tensor, P: torch.Tensor, beta1: float, beta2: float) -> None:
    """PreFed's moments (Tao et al., AISTATS 2022, Alg. 2 and 3): m <- b1 m + (1 - b1) g ;
    P <- b2 P + (1 - b2) (g - m)^2 with the updated m (the SDProp / AdaBelief variance around the momentum)."""
    m.mul_(beta1).add_(grad, alpha=1 - beta1)
    deviation = grad - m
    P.mul_(beta2).addcmul_(deviation, deviation, value=1 - beta2)
