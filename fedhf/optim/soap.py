"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner (docs/algorithms.md 1.4, 2.9b).

Vyas et al., 2024, "SOAP: Improving and Stabilizing Shampoo using Adam" (arXiv:2409.11321); reference
implementation github.com/nikhilvyas/SOAP ``soap.py`` (the version vendored unchanged in the FedPAC repo).

Per tensor p with gradient G, SOAP keeps one Shampoo factor per dimension (for an m x n matrix L = EMA(G G^T),
m x m, and R = EMA(G^T G), n x n; a conv filter gets four), their eigenbases Q, and Adam's moments m, V in the
rotated basis. A step rotates G into the eigenbasis, runs bias-corrected Adam there, rotates the step back and
applies decoupled weight decay *after* it; then the factors absorb G and every ``precondition_frequency``
updates the eigenbases are refreshed by one power iteration + QR. A dimension larger than ``max_precond_dim``
(and every 1-D tensor unless ``precondition_1d``) has no factor: its basis is the identity, so a tensor without
any factor is trained by plain bias-corrected AdamW with SOAP's betas, eps and weight decay.

The first step of every tensor -- 1-D ones included, as in the reference -- only builds the factors from G
(lerped into whatever factors exist: zeros, or an imported Theta) and their eigenbases by ``eigh``; it moves
nothing. The step counter counts real updates only.

Theta (docs/algorithms.md 2.9b, 2.15) is the factors only, state keys ``"GG0"``, ``"GG1"``, ... (one per
preconditioned dimension). The eigenbases ``"Q0"``, ... , ``exp_avg``, ``exp_avg_sq`` and ``step`` stay local.

Deviations from the reference, all said on purpose:
* ``merge_dims``, ``normalize_grads`` and ``data_format`` are not implemented (their defaults -- off,
  channels_first -- are what FedPAC uses).
* The reference rotates ``exp_avg`` back and forth (Q m Q^T, then Q^T m Q) after *every* step; this does it
  only when the eigenbasis changes. With orthogonal Q the round trip is the identity, so only float rounding
  differs.
* No ``1e-30 * I`` is added before ``eigh`` (a no-op in float32 except on an all-zero factor, whose basis is
  arbitrary either way); a failing float32 ``eigh`` is retried in float64, as in the reference.
* ``import_theta`` drops the eigenbasis, moments and step counter of the tensors it sets: new factors make
  the old eigenbasis stale, and 2.9b restarts m, V, t with the next (non-moving) step.

Order options (defaults = the authors' code, docs/algorithms.md 1.4; the paper and the code order them differently):
* ``factor_update="after"`` (default): the factors absorb G after the parameter step, so a step never uses its
  own gradient's outer product (as the paper's single-step listing also writes it). ``"before"``: the factors
  absorb G first and a due refresh runs before the step, so the basis G is projected with already contains G
  (Shampoo's usual order).
* ``eigenbasis_refresh="sorted"`` (default): before the power step the columns of Q are sorted by their Rayleigh
  quotients diag(Q^T L Q), descending, and V is permuted alongside. ``"power_qr"``: Q <- QR(L Q) with Q's columns
  in their current order and V unpermuted -- the paper's power-iteration + QR routine as written (its Alg. 4).
  QR orthogonalises the columns in order, so the two give different bases.
"""

from __future__ import annotations

import re
from typing import List, Mapping, Optional, Sequence, Tuple

import torch

from ..core.theta import GENERAL, SYMMETRIC_PSD
from .base import FederatedOptimizer, NamedParams, TensorDict, split_theta_key, theta_key
from .state_size import copies, nbytes

Bases = Sequence[Optional[torch.Tensor]]  # one entry per tensor dimension; None = identity (no factor)
_FACTOR_KEY = re.compile(r"GG(\d+)")
FACTOR_UPDATES = ("after", "before")
EIGENBASIS_REFRESHES = ("sorted", "power_qr")


def preconditioned_dims(shape: torch.Size, max_precond_dim: int, precondition_1d: bool) -> List[int]:
    """The dimensions that get a Shampoo factor."""
    if len(shape) == 1 and not precondition_1d:
        return []
    return [d for d, size in enumerate(shape) if size <= max_precond_dim]


def gradient_outer(grad: torch.Tensor, dim: int) -> torch.Tensor:
    """G G^T along ``dim``: the contraction of G with itself over every other dimension."""
    others = [d for d in range(grad.ndim) if d != dim]
    return torch.tensordot(grad, grad, dims=(others, others))


def update_factors(factors: Bases, grad: torch.Tensor, shampoo_beta: float) -> None:
    """In place: each factor <- shampoo_beta * factor + (1 - shampoo_beta) * (G G^T along its dimension)."""
    for dim, factor in enumerate(factors):
        if factor is not None:
            factor.lerp_(gradient_outer(grad, dim), 1 - shampoo_beta)


def project(x: torch.Tensor, bases: Bases) -> torch.Tensor:
    """Into the eigenbasis: x contracted with Q along every dimension (Q_L^T X Q_R for a matrix).

    Each ``tensordot`` contracts the leading dimension and appends the new one last, so after one pass over
    the dimensions they are back in their original order; a dimension without a basis is only rotated along.
    """
    for basis in bases:
        x = x.permute(*range(1, x.ndim), 0) if basis is None else torch.tensordot(x, basis, dims=([0], [0]))
    return x


def project_back(x: torch.Tensor, bases: Bases) -> torch.Tensor:
    """Out of the eigenbasis, the inverse of :func:`project` (Q_L X Q_R^T for a matrix)."""
    for basis in bases:
        x = x.permute(*range(1, x.ndim), 0) if basis is None else torch.tensordot(x, basis, dims=([0], [1]))
    return x


def eigenbases(factors: Bases) -> List[Optional[torch.Tensor]]:
    """Eigenvectors of each factor, columns sorted by descending eigenvalue (``eigh`` sorts ascending)."""
    out = []
    for factor in factors:
        if factor is None:
            out.append(None)
            continue
        try:
            vectors = torch.linalg.eigh(factor)[1]
        except RuntimeError:  # float32 eigh can fail to converge on ill-conditioned factors
            vectors = torch.linalg.eigh(factor.double())[1].to(factor.dtype)
        out.append(vectors.flip(1))
    return out


def refresh_eigenbases(factors: Bases, bases: Bases, exp_avg_sq: torch.Tensor, sort: bool = True
                       ) -> Tuple[List[Optional[torch.Tensor]], torch.Tensor]:
    """One power iteration + QR per factor, warm-started from the current basis (SOAP's cheap refresh).

    The old basis columns are first sorted by their Rayleigh quotients diag(Q^T L Q), descending, and V is
    permuted along that dimension by the same order: its coordinates follow their eigenvectors. V is never
    rotated -- SOAP's approximation. Returns the new bases and the permuted V. ``sort=False`` keeps the columns
    in their order and V as it is (``eigenbasis_refresh="power_qr"``).
    """
    out = []
    for dim, (factor, basis) in enumerate(zip(factors, bases)):
        if factor is None:
            out.append(None)
            continue
        # L Q is needed twice: its column-wise dot with Q gives diag(Q^T L Q), and permuted it is the power step.
        factor_basis = factor @ basis
        if not sort:
            out.append(torch.linalg.qr(factor_basis)[0])
            continue
        order = torch.argsort((basis * factor_basis).sum(0), descending=True)
        exp_avg_sq = exp_avg_sq.index_select(dim, order)
        out.append(torch.linalg.qr(factor_basis[:, order])[0])
    return out, exp_avg_sq


def soap_direction(grad: torch.Tensor, bases: Bases, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                   step: int, betas: Tuple[float, float], eps: float, correct_bias: bool = True) -> torch.Tensor:
    """Adam in the eigenbasis. Updates the rotated moments in place and returns D with p <- p - lr * D:

    G' = project(G); m <- b1 m + (1-b1) G'; V <- b2 V + (1-b2) G'^2;
    D = sqrt(1-b2^t)/(1-b1^t) * project_back(m / (sqrt(V) + eps)).
    (eps sits inside the bias correction, as in the reference; torch's AdamW adds it after.)
    """
    beta1, beta2 = betas
    rotated = project(grad, bases)
    exp_avg.mul_(beta1).add_(rotated, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).add_(rotated.square(), alpha=1 - beta2)
    direction = project_back(exp_avg / (exp_avg_sq.sqrt() + eps), bases)
    if correct_bias:
        direction.mul_((1 - beta2 ** step) ** 0.5 / (1 - beta1 ** step))
    return direction


class SOAP(FederatedOptimizer):
    """SOAP (Vyas et al., 2024) with the reference defaults; Theta = the Shampoo factors ``GG<dim>``.

    ``shampoo_beta < 0`` uses ``betas[1]`` for the factors' EMA. ``factor_update`` and ``eigenbasis_refresh``: see
    the module docstring.
    """

    def __init__(self, params: NamedParams, lr: float = 3e-3, betas: Tuple[float, float] = (0.95, 0.95),
                 shampoo_beta: float = -1.0, eps: float = 1e-8, weight_decay: float = 0.01,
                 precondition_frequency: int = 10, max_precond_dim: int = 10000, precondition_1d: bool = False,
                 correct_bias: bool = True, factor_update: str = "after", eigenbasis_refresh: str = "sorted") -> None:
        if factor_update not in FACTOR_UPDATES or eigenbasis_refresh not in EIGENBASIS_REFRESHES:
            raise ValueError(f"`factor_update` must be one of {FACTOR_UPDATES} and `eigenbasis_refresh` one of "
                             f"{EIGENBASIS_REFRESHES}, got {factor_update!r}, {eigenbasis_refresh!r}.")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), shampoo_beta=shampoo_beta, eps=eps,
                                      weight_decay=weight_decay, precondition_frequency=precondition_frequency,
                                      max_precond_dim=max_precond_dim, precondition_1d=precondition_1d,
                                      correct_bias=correct_bias, factor_update=factor_update,
                                      eigenbasis_refresh=eigenbasis_refresh))

    @classmethod
    def state_bytes(cls, params, max_precond_dim: int = 10000, precondition_1d: bool = False, **kwargs) -> int:
        """m and v (fp32), and per preconditioned dimension d a factor GG_d and an eigenbasis Q_d (d x d, fp32)."""
        square = sum(2 * nbytes(p.shape[d] ** 2, torch.float32) for p in params.values()
                     for d in preconditioned_dims(p.shape, max_precond_dim, precondition_1d))
        return copies(params, 2, lambda p: torch.float32) + square

    @staticmethod
    def _dims(group: dict, p: torch.Tensor) -> List[int]:
        return preconditioned_dims(p.shape, group["max_precond_dim"], group["precondition_1d"])

    def update(self) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            shampoo_beta = group["shampoo_beta"] if group["shampoo_beta"] >= 0 else beta2
            lr = group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, state = p.grad.float(), self.state[p]
                for d in self._dims(group, p):  # key by key, so imported factors survive
                    if f"GG{d}" not in state:
                        state[f"GG{d}"] = torch.zeros(p.shape[d], p.shape[d], device=p.device)
                factors = [state.get(f"GG{d}") for d in range(p.ndim)]
                if "step" not in state:  # no eigenbasis yet: build it, move nothing
                    update_factors(factors, grad, shampoo_beta)
                    self._set_bases(state, eigenbases(factors))
                    state["step"] = 0
                    for key in ("exp_avg", "exp_avg_sq"):
                        if key not in state:
                            state[key] = torch.zeros_like(grad)
                    continue
                state["step"] += 1
                bases = [state.get(f"Q{d}") for d in range(p.ndim)]
                before = group["factor_update"] == "before"
                if before:  # Shampoo's order: the basis used below already contains G
                    update_factors(factors, grad, shampoo_beta)
                    bases = self._refresh_if_due(group, state, factors, bases)
                direction = soap_direction(grad, bases, state["exp_avg"], state["exp_avg_sq"], state["step"],
                                           (beta1, beta2), group["eps"], group["correct_bias"])
                p.add_(direction.to(p.dtype), alpha=-lr)
                if group["weight_decay"] > 0:  # decoupled, after the update (reference order)
                    p.mul_(1 - lr * group["weight_decay"])
                if not before:  # the reference order: the projection never contains the current gradient
                    update_factors(factors, grad, shampoo_beta)
                    self._refresh_if_due(group, state, factors, bases)

    def _refresh_if_due(self, group: dict, state: dict, factors: Bases, bases: Bases) -> Bases:
        """Every ``precondition_frequency`` updates: new bases (m re-projected, V permuted if sorted); the bases now
        in use."""
        if all(b is None for b in bases) or state["step"] % group["precondition_frequency"] != 0:
            return bases
        exp_avg = project_back(state["exp_avg"], bases)
        new_bases, state["exp_avg_sq"] = refresh_eigenbases(factors, bases, state["exp_avg_sq"],
                                                            sort=group["eigenbasis_refresh"] == "sorted")
        state["exp_avg"] = project(exp_avg, new_bases)
        self._set_bases(state, new_bases)
        return new_bases

    @staticmethod
    def _set_bases(state: dict, bases: Bases) -> None:
        for d, basis in enumerate(bases):
            if basis is not None:
                state[f"Q{d}"] = basis

    # ---------------------------------------------------------------- Theta = the factors
    @classmethod
    def theta_kind(cls, state_key: str) -> str:
        return SYMMETRIC_PSD if _FACTOR_KEY.fullmatch(state_key) else GENERAL  # L = GG0, R = GG1, ...

    def export_theta(self) -> TensorDict:
        out = {}
        for name, p in self.named_params():
            state = self.state.get(p, {})
            for key in sorted((k for k in state if _FACTOR_KEY.fullmatch(k)), key=lambda k: int(k[2:])):
                out[theta_key(key, name)] = state[key].detach().float().clone()
        return out

    def import_theta(self, theta: Mapping[str, torch.Tensor]) -> None:
        """Sets factors; the tensors they belong to restart (eigenbasis, moments, step) at their next step."""
        by_name = dict(self.named_params())
        group_of = {p: group for group in self.param_groups for p in group["params"]}
        for key, value in theta.items():
            state_key, name = split_theta_key(key)
            match = _FACTOR_KEY.fullmatch(state_key)
            p = by_name.get(name)
            if p is None or match is None or int(match.group(1)) not in self._dims(group_of[p], p):
                raise KeyError(f"SOAP has no Theta entry {key!r}")
            size = p.shape[int(match.group(1))]
            if tuple(value.shape) != (size, size):
                raise ValueError(f"Theta entry {key!r} has shape {tuple(value.shape)}, expected {(size, size)}")
            state = self.state[p]
            for local in [k for k in state if not _FACTOR_KEY.fullmatch(k)]:
                del state[local]
            state[state_key] = value.detach().to(device=p.device, dtype=torch.float32).clone()
