"""Sophia: a clipped, diagonally preconditioned sign-momentum optimizer (docs/algorithms.md 1.5, 2.1, 2.9c, 2.12).

Liu et al. 2023, "Sophia: A Scalable Stochastic Second-order Optimizer" (reference code: github.com/Liuhong99/Sophia,
``sophia.py`` SophiaG and ``train_sophiag.py``). The update uses the reference code's parameterisation::

    p <- p (1 - lr wd);  m <- b1 m + (1 - b1) G;  p <- p - lr sign(m) min(|m| / (rho bs h + eps), 1)

with no bias correction. ``h`` is an EMA of a diagonal curvature estimate, refreshed every ``hess_interval`` local
steps on that step's batch by one of three estimators (``hessian_estimator``):

* ``"gnb"`` (default, SophiaG): Gauss-Newton-Bartlett. Sample y_hat ~ softmax(logits), g_hat = grad of the mean
  CE(logits, y_hat), h_hat = g_hat * g_hat. Since E[g_hat] = 0 per example, bs * E[h_hat] is the diagonal of the
  Gauss-Newton matrix of the mean loss, so ``bs`` (labelled rows of the curvature batch) enters the update.
* ``"hutchinson"`` (SophiaH; kozistr pytorch_optimizer, FedPAC Algorithms 8/9): h_hat = u * (H u) with Rademacher
  u, clamped at 0 before the EMA (FedPAC). It is already the Hessian diagonal of the mean loss, so bs = 1. Needs a
  double backward through the model: transformers models must be loaded with ``attn_implementation="eager"`` (the
  SDPA / flash attention kernels lack a double backward in some versions), and gradient checkpointing must be off.
* ``"empirical_fisher"`` (FedPAC code's Local Sophia, run with ``hess_interval=1``): h_hat = g * g with g the
  true-label gradient of the training loss.

Deviation from the reference script, on purpose: it refreshes h after step k-1 on the next batch, which is the
batch of step k; here the refresh runs in :meth:`Sophia.before_forward` of steps 0, k, 2k, ... (the same batch),
so a client round also refreshes at its step 0 and never runs a short round (K < k) on h = 0 alone. The refresh
uses ``torch.autograd.grad`` and so leaves ``.grad`` untouched for the step's own backward. Its random draws come
from torch's global RNG, which the trainer seeds per client.

Theta (what FedPAC_Sophia averages and warm-starts, Fed-Sophia persists) is ``h``; m restarts with the optimizer,
unless ``momentum_in_theta=True`` makes Theta {h, m} (state keys ``hessian`` and ``exp_avg``): Fed-Sophia keeps both
per client (docs/algorithms.md 2.12, 5.16).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..core.theta import NONNEGATIVE
from .base import FederatedOptimizer, NamedParams
from .state_size import copies

HESSIAN_ESTIMATORS = ("gnb", "hutchinson", "empirical_fisher")
LABEL_SAMPLERS = ("multinomial", "inverse_cdf")  # how GNB draws y_hat: see sample_labels
IGNORE_INDEX = -100  # HF's padding label
Grads = List[Optional[torch.Tensor]]


# ---------------------------------------------------------------- the update
def sophia_direction(exp_avg: torch.Tensor, hessian: torch.Tensor, rho: float, batch_size: float,
                     eps: float = 1e-15) -> torch.Tensor:
    """P_Theta: sign(m) min(|m| / (rho bs h + eps), 1) -- a Newton-like step m/(bs h), clipped per coordinate."""
    # clamp(m / d, -1, 1) with d = rho bs h + eps > 0 is sign(m) min(|m| / d, 1) bit for bit (IEEE division is
    # symmetric in the sign of m), in three elementwise passes instead of five (the step's cost, not its math).
    return exp_avg.div(torch.mul(hessian, rho * batch_size).add_(eps)).clamp_(-1.0, 1.0)


def sophia_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, hessian: torch.Tensor, *,
                  lr: float, beta1: float, rho: float, weight_decay: float, batch_size: float,
                  eps: float = 1e-15) -> None:
    """One SophiaG step in place: decoupled weight decay, momentum EMA, clipped preconditioned step."""
    param.mul_(1.0 - lr * weight_decay)
    exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    param.add_(sophia_direction(exp_avg, hessian, rho, batch_size, eps).to(param.dtype), alpha=-lr)


def sophia_update_foreach(params: List[torch.Tensor], grads: List[torch.Tensor], exp_avgs: List[torch.Tensor],
                          hessians: List[torch.Tensor], *, lr: float, beta1: float, rho: float, weight_decay: float,
                          batch_size: float, eps: float = 1e-15) -> None:
    """:func:`sophia_update` on lists of float32 tensors with ``torch._foreach_*`` ops: the same elementwise
    operations in the same order (bit-identical), one kernel per operation for all tensors instead of one per
    tensor -- what pays on LoRA's many small factors, where per-tensor dispatch dominates the step."""
    torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
    denominators = torch._foreach_mul(hessians, rho * batch_size)
    torch._foreach_add_(denominators, eps)
    directions = torch._foreach_div(exp_avgs, denominators)
    torch._foreach_clamp_min_(directions, -1.0)
    torch._foreach_clamp_max_(directions, 1.0)
    torch._foreach_add_(params, directions, alpha=-lr)


def ema_hessian_(hessian: torch.Tensor, estimate: torch.Tensor, beta2: float) -> None:
    hessian.mul_(beta2).add_(estimate.to(hessian.dtype), alpha=1.0 - beta2)


# ---------------------------------------------------------------- curvature estimates
def labelled_rows(logits: torch.Tensor, labels: Optional[torch.Tensor], shift: bool) -> torch.Tensor:
    """Logits (..., C) flattened to the (rows, C) that carry a label.

    Rows whose label is ``IGNORE_INDEX`` are dropped when the labels have one entry per row. With ``shift`` and
    per-position labels ((B, T) labels for (B, T, C) logits), position t is paired with label t + 1 and the last
    position is dropped, as HF causal LMs shift inside their loss. Without labels every row counts.
    """
    if labels is not None and shift and labels.dim() >= 2 and tuple(labels.shape) == tuple(logits.shape[:-1]):
        logits, labels = logits[..., :-1, :], labels[..., 1:]
    rows = logits.reshape(-1, logits.shape[-1])
    if labels is not None and labels.numel() == rows.shape[0]:
        rows = rows[labels.reshape(-1).to(rows.device) != IGNORE_INDEX]
    return rows


def count_label_rows(labels: torch.Tensor, shift: bool) -> int:
    """Examples (or non-ignored tokens) a loss is averaged over; the ``bs`` of the empirical-Fisher estimate."""
    if shift and labels.dim() >= 2:
        labels = labels[..., 1:]
    return int((labels != IGNORE_INDEX).sum()) if not labels.is_floating_point() else labels.shape[0]


def sample_labels(logits: torch.Tensor, sampler: str = "inverse_cdf") -> torch.Tensor:
    """y_hat ~ softmax(logits) for each row of (rows, C) logits (torch's global RNG).

    ``"inverse_cdf"`` (default): one uniform u per row scaled to the row's total, y = the first class whose
    cumulative probability reaches u -- P(y = i) = p_i from C times fewer random numbers. ``"multinomial"``:
    ``torch.multinomial``, what the Sophia authors' ``train_sophiag.py`` calls: the same distribution, other draws
    for a given seed, and one exponential draw per logit -- on CPU at 4,096 tokens x 10,240 classes more than a
    training step, so with it Sophia's whole 4K-token local step cost 1.29-1.33x AdamW's against 1.16-1.20x
    (benchmarks/README, two machines); an LLM's 32-256 K vocabulary makes the gap wider."""
    probs = torch.softmax(logits.detach().to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    if sampler == "multinomial":
        return torch.multinomial(probs, 1).squeeze(-1)
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(cdf.shape[0], 1, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


def clip_by_global_norm(grads: Grads, max_norm: Optional[float]) -> Grads:
    """Global-norm clipping as ``clip_grad_norm_`` (the reference script clips the sampled-label gradient too)."""
    present = [g for g in grads if g is not None]
    if max_norm is None or not present:
        return grads
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in present]))
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    return [None if g is None else g * scale.to(g.dtype) for g in grads]


def gnb_estimate(logits: torch.Tensor, sampled_labels: torch.Tensor, params: Sequence[torch.Tensor],
                 max_norm: Optional[float] = None) -> Grads:
    """h_hat = g_hat * g_hat with g_hat the gradient of mean CE((rows, C) logits, sampled labels); None if unused."""
    loss = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), sampled_labels)
    grads = clip_by_global_norm(list(torch.autograd.grad(loss, params, allow_unused=True)), max_norm)
    return [None if g is None else g * g for g in grads]


def empirical_fisher_estimate(loss: torch.Tensor, params: Sequence[torch.Tensor],
                              max_norm: Optional[float] = None) -> Grads:
    """h_hat = g * g with g the true-label gradient of ``loss``."""
    grads = clip_by_global_norm(list(torch.autograd.grad(loss, params, allow_unused=True)), max_norm)
    return [None if g is None else g * g for g in grads]


def hutchinson_estimate(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> Grads:
    """h_hat = u * (H u), u Rademacher: an unbiased estimate of diag(H) (exact when H is diagonal)."""
    try:
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        used = [i for i, g in enumerate(grads) if g is not None]
        probes = {i: torch.randint(0, 2, grads[i].shape, device=grads[i].device).to(grads[i].dtype) * 2 - 1
                  for i in used}
        g_dot_u = sum((grads[i] * probes[i]).sum() for i in used) if used else None
        if g_dot_u is None or not g_dot_u.requires_grad:  # loss linear in the params: H = 0
            hvps: Sequence[Optional[torch.Tensor]] = [None] * len(used)
        else:
            hvps = torch.autograd.grad(g_dot_u, [params[i] for i in used], allow_unused=True)
    except RuntimeError as error:
        raise RuntimeError(
            "Sophia's Hutchinson estimator needs a double backward through the model, which failed: "
            f"{error}. For transformers models load the model with attn_implementation=\"eager\" (SDPA/flash "
            "attention lack a double backward in some versions) and turn gradient checkpointing off, or use "
            "hessian_estimator=\"gnb\"."
        ) from error
    out: Grads = [None] * len(params)
    for i, hvp in zip(used, hvps):
        out[i] = (probes[i] * hvp).detach() if hvp is not None else torch.zeros_like(probes[i])
    return out


def _is_causal_lm(model: torch.nn.Module) -> bool:
    """Whether the model (or a module inside it, e.g. under PEFT) is a transformers causal LM, which shifts labels."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())  # e.g. LlamaForCausalLM, GPT2LMHeadModel
    except ImportError:
        causal = set()
    return any(type(m).__name__ in causal or type(m).__name__.endswith("ForCausalLM") for m in model.modules())


# ---------------------------------------------------------------- the optimizer
class Sophia(FederatedOptimizer):
    """SophiaG (code parameterisation) with a selectable curvature estimator; see the module docstring.

    ``hess_interval``: refresh h at local steps 0, k, 2k, ... (1 reproduces FedPAC's Local Sophia code).
    ``hessian_grad_clip``: optional global-norm clip of the sampled-label (or true-label) gradient before squaring,
    as ``train_sophiag.py`` does with its ``grad_clip``; None (default) leaves it unclipped.
    ``shift_labels``: pair logits position t with label t + 1 (HF causal LMs); None detects a transformers causal
    LM class (``*ForCausalLM``, ``GPT2LMHeadModel``, ...) anywhere in the model, PEFT wrappers included.
    ``momentum_in_theta``: Theta is {h, m} instead of h alone, so a state-sync rule keeps or averages m too.
    ``label_sampler``: how GNB draws its labels (:func:`sample_labels`): ``"inverse_cdf"`` (default) or the
    reference code's ``"multinomial"`` (same distribution, its draws, slower).
    """

    theta_keys = ("hessian",)
    theta_kinds = {"hessian": NONNEGATIVE}  # a negative h would flip the sign of Sophia's step
    needs_model = True

    def __init__(self, params: NamedParams, lr: float = 1e-4, betas: Tuple[float, float] = (0.965, 0.99),
                 rho: float = 0.04, weight_decay: float = 0.1, hessian_estimator: str = "gnb",
                 hess_interval: int = 10, eps: float = 1e-15, hessian_grad_clip: Optional[float] = None,
                 shift_labels: Optional[bool] = None, momentum_in_theta: bool = False,
                 label_sampler: str = "inverse_cdf") -> None:
        if hessian_estimator not in HESSIAN_ESTIMATORS:
            raise ValueError(f"`hessian_estimator` must be one of {HESSIAN_ESTIMATORS}, got {hessian_estimator!r}.")
        if label_sampler not in LABEL_SAMPLERS:
            raise ValueError(f"`label_sampler` must be one of {LABEL_SAMPLERS}, got {label_sampler!r}.")
        if hess_interval < 1:
            raise ValueError(f"`hess_interval` must be >= 1, got {hess_interval}.")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0) or lr < 0 or rho <= 0 or weight_decay < 0:
            raise ValueError(f"Sophia: invalid lr={lr}, betas={betas}, rho={rho} or weight_decay={weight_decay}.")
        self.hessian_estimator, self.label_sampler = hessian_estimator, label_sampler
        self.hess_interval = hess_interval
        self.momentum_in_theta = bool(momentum_in_theta)  # fixed per optimizer: it decides what Theta is
        self.theta_keys = ("hessian", "exp_avg") if self.momentum_in_theta else ("hessian",)
        self.hessian_grad_clip = hessian_grad_clip
        self.shift_labels = shift_labels
        # "hessian_batch_size" is bs of the last refresh; kept in the param groups so state_dict round-trips it.
        super().__init__(params, dict(lr=lr, betas=tuple(betas), rho=rho, weight_decay=weight_decay, eps=eps,
                                      hessian_batch_size=1))

    # ------------------------------------------------------------ curvature
    def before_forward(self, step: int, batch: Mapping[str, Any]) -> None:
        if step % self.hess_interval == 0:
            self.refresh_hessian(batch)

    def refresh_hessian(self, batch: Mapping[str, Any]) -> None:
        """h <- b2 h + (1 - b2) h_hat on ``batch``, and bs <- its labelled rows (1 for Hutchinson)."""
        access = self.model_access
        if access is None:
            raise RuntimeError("Sophia needs the model for its Hessian refresh: call attach(ModelAccess) first.")
        if self.shift_labels is None:  # decided once: module types do not change during training
            self.shift_labels = _is_causal_lm(access.model)
        labels = batch.get("labels")
        owned = [(p, group["betas"][1]) for group in self.param_groups for p in group["params"] if p.requires_grad]
        params = [p for p, _ in owned]
        with torch.enable_grad():
            if self.hessian_estimator == "gnb":
                logits = labelled_rows(access.logits(batch), labels, self.shift_labels)
                if logits.shape[0] == 0:
                    return  # nothing labelled in this batch: keep h and bs
                labels_hat = sample_labels(logits, self.label_sampler)
                estimates = gnb_estimate(logits, labels_hat, params, self.hessian_grad_clip)
                batch_size = logits.shape[0]
            elif self.hessian_estimator == "empirical_fisher":
                estimates = empirical_fisher_estimate(access.loss(batch), params, self.hessian_grad_clip)
                batch_size = count_label_rows(labels, self.shift_labels) if labels is not None else 1
            else:
                estimates = [None if e is None else e.clamp(min=0.0)  # FedPAC Alg. 8/9: max(h_hat, 0)
                             for e in hutchinson_estimate(access.loss(batch), params)]
                batch_size = 1
        with torch.no_grad():
            for (p, beta2), estimate in zip(owned, estimates):
                if estimate is None:  # unused parameter: no curvature information
                    continue
                state = self.state[p]
                if "hessian" not in state:
                    state["hessian"] = torch.zeros_like(p, dtype=torch.float32)
                ema_hessian_(state["hessian"], estimate, beta2)
        for group in self.param_groups:
            group["hessian_batch_size"] = batch_size

    @classmethod
    def logits_pass(cls, **kwargs) -> Optional[str]:
        return "backward" if kwargs.get("hessian_estimator", "gnb") == "gnb" else None  # the others: access.loss

    @classmethod
    def unplanned_memory(cls, **kwargs) -> Optional[str]:
        if kwargs.get("hessian_estimator") == "hutchinson":
            return "Sophia's Hutchinson estimator backpropagates through the gradient's graph: not counted"
        return None

    # ------------------------------------------------------------ step
    @classmethod
    def state_bytes(cls, params, **kwargs) -> int:
        return copies(params, 2, lambda p: torch.float32)  # m and h in fp32 (the step counter is a Python int)

    def update(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                state = self.state[p]
                # Key by key, so an imported Theta (h only) survives the first step.
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                if "hessian" not in state:
                    state["hessian"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] = state.get("step", 0) + 1
            settings = dict(lr=group["lr"], beta1=group["betas"][0], rho=group["rho"], eps=group["eps"],
                            weight_decay=group["weight_decay"], batch_size=group["hessian_batch_size"])
            if params and all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in params):
                sophia_update_foreach(params, [p.grad for p in params], [self.state[p]["exp_avg"] for p in params],
                                      [self.state[p]["hessian"] for p in params], **settings)
                continue
            for p in params:  # half-precision parameters: float32 state, one tensor at a time
                sophia_update(p, p.grad, self.state[p]["exp_avg"], self.state[p]["hessian"], **settings)
