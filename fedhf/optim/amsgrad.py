"""Adam without bias correction, with the AMSGrad max: the local optimizer of FAdamET and FAdamGT.

Chen et al., 2025, "Parameter Tracking in Federated Learning with Adaptive Optimization" (arXiv 2502.02727,
Algorithm 1 lines 13-16)::

    g <- g + lambda p                               (coupled weight decay, tiny: 1e-8)
    m <- b1 m + (1 - b1) g ;  v <- b2 v + (1 - b2) g*g
    v_hat <- max(v_hat, v)                          (AMSGrad; v_hat = v when ``amsgrad=False``)
    p <- p - lr m / (sqrt(v_hat) + eps)

There is no bias correction: the moments are meant to carry over between rounds, so the first-step bias that
the correction removes does not exist after round 0.

Theta (what persists across rounds) is ``max_exp_avg_sq`` (v_hat) with AMSGrad, else ``exp_avg_sq`` (v).
FAdam persists v_hat per client; we read its Algorithm 1 line 8 as "v and v_hat initialised from
the persisted v_i", so :meth:`import_theta` starts *both* v and v_hat from the imported v_hat. The first moment m
is never Theta and starts at 0 every round. With ``amsgrad=False`` this is the Adam of FedLADA's baseline
(Sun et al., 2023, as the FedAdamW code runs it: v averaged over the clients and warm-started each round, m
reset).

``fresh_bias_correction=True`` (FedLADA's default) bias-corrects the steps of a parameter whose v was *not*
imported, i.e. while there is no carried state (the first round): m / (1 - b1^t) over sqrt(v / (1 - b2^t)) + eps,
t counting this round's steps, which is ordinary Adam. Once v is imported (a warm start) the step is uncorrected.
This is what FedLADA's reference implementation (the baseline in the FedAdamW code) does: it switches torch Adam's
bias correction off by setting the step counter to 10^6, but only for parameters that already carry state from a
previous round; in round one its Adam starts from zero moments with the usual correction. Without the correction
the first steps from v = 0 are several times larger (m / sqrt(v) = (1 - b1) / sqrt(1 - b2) ~ 3.2 at t = 1 for the
default betas). FAdam (``False``, the default) has no correction in any round (Chen et al., Algorithm 1).
"""

from __future__ import annotations

from typing import Mapping, Optional, Tuple

import torch

from ..core.theta import NONNEGATIVE
from ..core.updates import adaptive_moments_
from .base import FederatedOptimizer, NamedParams, split_theta_key
from .state_size import copies, state_dtype


@torch.no_grad()
def amsgrad_no_bias_direction(grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                              v_hat: Optional[torch.Tensor], beta1: float, beta2: float, eps: float) -> torch.Tensor:
    """Update m, v (and v_hat, if given) in place; return A = m / (sqrt(v_hat) + eps), v_hat = v without AMSGrad.
    The moments are the server FedAdam's (:func:`fedhf.core.updates.adaptive_moments_`)."""
    adaptive_moments_(grad, m, v, beta1, beta2, "adam")
    if v_hat is None:
        v_hat = v
    else:
        torch.maximum(v_hat, v, out=v_hat)
    return m / (v_hat.sqrt() + eps)


@torch.no_grad()
def bias_corrected_direction(grad: torch.Tensor, state, beta1: float, beta2: float, eps: float) -> torch.Tensor:
    """The moments as :func:`amsgrad_no_bias_direction` updates them, then (m / (1 - b1^t)) over
    (sqrt(v_hat / (1 - b2^t)) + eps), t = ``state["step"]`` (Kingma & Ba, 2015, Algorithm 1)."""
    t = state["step"]
    amsgrad_no_bias_direction(grad, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"), beta1,
                              beta2, eps)
    v_hat = state.get("max_exp_avg_sq", state["exp_avg_sq"])
    return (state["exp_avg"] / (1 - beta1 ** t)) / ((v_hat / (1 - beta2 ** t)).sqrt() + eps)


class AMSGradNoBias(FederatedOptimizer):
    """Adam without bias correction, AMSGrad max on by default (Chen et al., 2025).

    Defaults are FAdam's (sec. 6.1): lr 1e-3, betas (0.9, 0.99), eps 1e-8, weight decay 1e-8.
    """

    theta_kinds = {"exp_avg_sq": NONNEGATIVE, "max_exp_avg_sq": NONNEGATIVE}

    def __init__(self, params: NamedParams, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.99),
                 eps: float = 1e-8, weight_decay: float = 1e-8, amsgrad: bool = True,
                 fresh_bias_correction: bool = False) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}.")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}.")
        self.amsgrad = bool(amsgrad)  # fixed per optimizer: it decides what Theta is
        self.theta_keys = ("max_exp_avg_sq",) if self.amsgrad else ("exp_avg_sq",)
        self.fresh_bias_correction = bool(fresh_bias_correction)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @classmethod
    def state_bytes(cls, params, amsgrad: bool = True, **kwargs) -> int:
        return copies(params, 3 if amsgrad else 2, state_dtype)  # m, v (+ v_hat)

    def import_theta(self, theta: Mapping[str, torch.Tensor]) -> None:
        """Warm start: with AMSGrad, v starts from the imported v_hat too (FAdam's Algorithm 1 line 8,
        read as the module docstring says)."""
        super().import_theta(theta)
        if self.amsgrad:
            by_name = dict(self.named_params())
            for key in theta:
                p = by_name[split_theta_key(key)[1]]
                self.state[p]["exp_avg_sq"] = self.state[p]["max_exp_avg_sq"].clone()

    def update(self) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                keys = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if self.amsgrad else ())
                if self.fresh_bias_correction and self.theta_keys[0] not in self.state[p]:
                    self.state[p]["step"] = 0  # no v imported: this parameter's round starts from v = 0
                state, dtype = self.lazy_state(p, keys)
                grad = p.grad.to(dtype)
                if group["weight_decay"]:
                    grad = grad.add(p.to(dtype), alpha=group["weight_decay"])
                if "step" in state:  # fresh state: Adam's bias correction (see the module docstring)
                    state["step"] += 1
                    direction = bias_corrected_direction(grad, state, beta1, beta2, group["eps"])
                else:
                    direction = amsgrad_no_bias_direction(grad, state["exp_avg"], state["exp_avg_sq"],
                                                          state.get("max_exp_avg_sq"), beta1, beta2, group["eps"])
                p.add_(direction.to(p.dtype), alpha=-group["lr"])
