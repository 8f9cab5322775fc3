"""FOOF: SGD preconditioned by each layer's uncentered input covariance.

Benzing (2022), "Gradient Descent on Neurons and its Link to Approximate Second-Order Optimization" (ICML):
K-FAC with the output-gradient factor replaced by the identity. For a layer y = W a (+ b), with the bias folded
into a homogeneous coordinate (W_aug = [W | b], a_aug = [a; 1]):

    A = E[a_aug a_aug^T]                                  over examples (and token / spatial positions)
    W_aug <- W_aug - lr * G_aug (A + damping I)^{-1},     G_aug = [G_W + wd W | G_b + wd b]   (coupled wd)

It is the local optimizer of FedPM (Ishii et al., AAAI 2026, arXiv 2511.09100, Eq. 11) and of LocalNewton as
FedPM runs it (docs/algorithms.md 1.6, 2.10, 2.11). Defaults follow FedPM's App. C: lr 0.3, damping 1.0, wd 1e-4.

FOOF layers: every ``nn.Linear`` -- peft's LoRA ``lora_A``/``lora_B`` included -- and every ``nn.Conv2d`` with
``groups == 1`` and numeric zero padding (patches unfolded, so in = C_in kh kw), whose ``weight`` this optimizer
holds. Everything else (norm affine parameters, embeddings, transformers' GPT-2 ``Conv1D``) takes a plain SGD step.

When A is computed (FedPM sec. 4.2, docs/algorithms.md 2.10 [RESOLVED]): once per round, in :meth:`end_round`, at
x_i^K on the client's data; it is Theta (state key ``"A"`` of the weight), so a state-sync rule can keep it for
the client's next round. Only a layer with no A (a fresh client, a reset state) gets one at x^r, before the first
local step. An imported A is used as is.

The statistics pass runs forwards under ``torch.no_grad`` in the model's current mode (dropout active as in
training), over ``model_access.batches()`` (which must be a finite pass), capped at ``curvature_samples``
examples. BatchNorm running statistics are saved and restored around it, so BN layers normalise with batch
statistics as in training but their buffers do not move. Token positions whose ``attention_mask`` is 0 are left
out (the mask weights positions of any layer input whose leading shape is the mask's); layers whose inputs are
pooled (a classification head) average over examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F

from ..core.params import augment
from ..core.theta import SYMMETRIC_PSD
from .base import FederatedOptimizer, NamedParams, TensorDict, theta_key
from .state_size import nbytes


# ---------------------------------------------------------------- the math
def input_covariance(inputs: torch.Tensor, homogeneous: bool,
                     weights: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(sum_n w_n a_n a_n^T, sum_n w_n) in float64 for rows a_n of ``inputs`` (n, in); a_n gets a trailing 1 when
    ``homogeneous``. Sums, so batches add; A is their ratio."""
    rows = inputs.detach().reshape(-1, inputs.shape[-1]).to(torch.float64)
    if homogeneous:
        rows = torch.cat([rows, rows.new_ones(rows.shape[0], 1)], dim=1)
    if weights is None:
        return rows.T @ rows, rows.new_tensor(float(rows.shape[0]))
    w = weights.reshape(-1).to(rows)
    return (rows * w[:, None]).T @ rows, w.sum()


def damped_cholesky(A: torch.Tensor, damping: float) -> torch.Tensor:
    """Lower Cholesky factor of A + damping I in float64, factorised once per refresh of A."""
    M = A.to(torch.float64) + damping * torch.eye(A.shape[0], dtype=torch.float64, device=A.device)
    factor, info = torch.linalg.cholesky_ex(M)
    if int(info) != 0:
        raise ValueError(f"FOOF: A + damping I is not positive definite (damping={damping}); raise `damping` "
                         "(local_optimizer_kwargs) above 0.")
    return factor


def foof_direction(G_aug: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """G_aug (A + damping I)^{-1}, float64, from the Cholesky factor: a solve of (A + damping I) X^T = G_aug^T
    (the matrix is symmetric), never an explicit inverse."""
    return torch.cholesky_solve(G_aug.to(torch.float64).T, chol).T


# ---------------------------------------------------------------- layers and their inputs
def is_foof_module(module: torch.nn.Module) -> bool:
    if isinstance(module, torch.nn.Linear):
        return True
    return (isinstance(module, torch.nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros"
            and not isinstance(module.padding, str))


def layer_input_rows(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's input as rows (..., in): a Linear's input as is, a Conv2d's unfolded patches (B, L, C kh kw)."""
    if isinstance(module, torch.nn.Conv2d):
        patches = F.unfold(x, module.kernel_size, module.dilation, module.padding, module.stride)
        return patches.transpose(1, 2)
    return x


@dataclass
class FoofLayer:
    module: torch.nn.Module
    weight: torch.Tensor
    bias: Optional[torch.Tensor]  # only when trainable here: it is then folded into A
    weight_name: str
    bias_name: Optional[str]


def _batch_size(batch: Mapping[str, Any]) -> int:
    return next(v.shape[0] for v in batch.values() if torch.is_tensor(v) and v.ndim > 0)


def _first_examples(batch: Mapping[str, Any], n: int) -> Dict[str, Any]:
    size = _batch_size(batch)
    return {k: v[:n] if torch.is_tensor(v) and v.ndim > 0 and v.shape[0] == size else v for k, v in batch.items()}


def _norm_modules(model: torch.nn.Module) -> List[torch.nn.Module]:
    return [m for m in model.modules()
            if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats]


# ---------------------------------------------------------------- the optimizer
class FOOF(FederatedOptimizer):
    """FOOF-preconditioned SGD on FOOF layers, plain SGD elsewhere, both with coupled weight decay.

    ``damping`` (lambda) is one value for the whole optimizer (FedPM's server adds the same lambda to A).
    ``damping=0`` is allowed while every A is positive definite. ``curvature_samples``: None uses the client's
    full local data for A (FedPM); an int caps the number of examples (FedPM App. D.4 ablates 64 to 1024).
    """

    theta_keys = ("A",)
    theta_kinds = {"A": SYMMETRIC_PSD}
    needs_model = True
    exports_preconditioners = True

    def __init__(self, params: NamedParams, lr: float = 0.3, damping: float = 1.0, weight_decay: float = 1e-4,
                 curvature_samples: Optional[int] = None) -> None:
        if lr < 0 or damping < 0 or weight_decay < 0:
            raise ValueError(f"FOOF needs lr, damping, weight_decay >= 0; got {lr}, {damping}, {weight_decay}.")
        if curvature_samples is not None and int(curvature_samples) < 1:
            raise ValueError(f"`curvature_samples` must be None (all local data) or >= 1, got {curvature_samples}.")
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        self.damping = float(damping)
        self.curvature_samples = None if curvature_samples is None else int(curvature_samples)
        self._layers: Optional[List[FoofLayer]] = None
        self._factors: Dict[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]] = {}  # weight -> (A, chol of A + lam I)

    @classmethod
    def logits_pass(cls, **kwargs) -> Optional[str]:
        return "no_grad"  # the statistics pass: forwards through ModelAccess.logits under torch.no_grad

    @classmethod
    def unplanned_memory(cls, **kwargs) -> Optional[str]:
        return ("FOOF's float64 Cholesky factors beside its statistics, and a preconditioned server's float64 "
                "solves, are not counted (FedPM on a Gemma-3-270M LoRA peaked 1.33x the plan)")

    @classmethod
    def state_bytes(cls, params, **kwargs) -> int:
        """A (fp32, (fan_in + 1)^2 when the layer's bias is folded in, else fan_in^2) per FOOF layer. Declared from
        the names alone: every weight of 2 or more dimensions is taken as a Linear/Conv2d layer's (an Embedding
        trained with FOOF would be over-counted). The float64 Cholesky factor cached beside A is not state."""
        total = 0
        for name, p in params.items():
            if p.ndim >= 2 and name.endswith("weight"):
                fan_in = p[0].numel() + (name[:-len("weight")] + "bias" in params)
                total += nbytes(fan_in ** 2, torch.float32)
        return total

    # ------------------------------------------------------------ layers
    def attach(self, access) -> None:
        super().attach(access)
        self._layers = None

    def foof_layers(self) -> List[FoofLayer]:
        if self._layers is None:
            if self.model_access is None:
                raise RuntimeError("FOOF needs the model to find its layers: call attach(ModelAccess(...)) first "
                                   "(FederatedTrainer does this for optimizers with needs_model = True).")
            held = self.param_names
            self._layers = []
            for _, module in self.model_access.model.named_modules():
                if is_foof_module(module) and module.weight in held:
                    bias = module.bias if module.bias is not None and module.bias in held else None
                    self._layers.append(FoofLayer(module, module.weight, bias, held[module.weight],
                                                  None if bias is None else held[bias]))
        return self._layers

    def layers(self) -> List[Tuple[str, Optional[str]]]:
        """(weight name, bias name or None) per FOOF layer; a bias is named when it is folded into A."""
        return [(layer.weight_name, layer.bias_name) for layer in self.foof_layers()]

    def preconditioners(self) -> TensorDict:
        """P = A + lambda I (float64) per FOOF layer's weight name, from Theta: the matrix FedPM mixes with. When
        the layer's bias is folded in, P is one larger than the weight's inputs (the homogeneous coordinate)."""
        theta = self.export_theta()
        out = {}
        for weight_name, _ in self.layers():
            A = theta.get(theta_key("A", weight_name))
            if A is None:
                raise RuntimeError(f"FOOF has no A for {weight_name!r}: call end_round() before preconditioners().")
            out[weight_name] = A.to(torch.float64) + self.damping * torch.eye(A.shape[0], dtype=torch.float64,
                                                                              device=A.device)
        return out

    # ------------------------------------------------------------ curvature
    def _curvature_batches(self) -> Iterator[Mapping[str, Any]]:
        left = self.curvature_samples
        for batch in self.model_access.batches():
            if left is not None:
                batch = _first_examples(batch, left) if _batch_size(batch) > left else batch
                left -= _batch_size(batch)
            yield batch
            if left is not None and left <= 0:
                return

    @torch.no_grad()
    def refresh_curvature(self, layers: Optional[List[FoofLayer]] = None) -> None:
        """A for ``layers`` (default: all) at the current parameters, by hooked no-grad forwards."""
        layers = self.foof_layers() if layers is None else layers
        if not layers:
            return
        model = self.model_access.model
        totals: Dict[int, list] = {id(layer.weight): [0.0, 0.0] for layer in layers}
        current: Dict[str, Optional[torch.Tensor]] = {"mask": None}

        def hook_for(layer: FoofLayer):
            def hook(module, inputs, output):
                rows = layer_input_rows(module, inputs[0])
                mask = current["mask"]
                use = mask is not None and tuple(rows.shape[:-1]) == tuple(mask.shape)
                s, n = input_covariance(rows, layer.bias is not None, mask.to(rows.device) if use else None)
                total = totals[id(layer.weight)]
                total[0], total[1] = total[0] + s, total[1] + n
            return hook

        norms = _norm_modules(model)
        saved = [{k: b.clone() for k, b in m.named_buffers(recurse=False) if b is not None} for m in norms]
        handles = [layer.module.register_forward_hook(hook_for(layer)) for layer in layers]
        try:
            for batch in self._curvature_batches():
                current["mask"] = batch.get("attention_mask") if isinstance(batch, Mapping) else None
                self.model_access.logits(batch)
        finally:
            for handle in handles:
                handle.remove()
            for module, buffers in zip(norms, saved):  # BN running statistics untouched by this pass
                for k, b in buffers.items():
                    getattr(module, k).copy_(b)
        for layer in layers:
            s, n = totals[id(layer.weight)]
            if not torch.is_tensor(s) or float(n) <= 0:
                raise ValueError(f"FOOF saw no input to layer {layer.weight_name!r} during the curvature pass: "
                                 "its forward does not call the module, or the local data is empty.")
            self.state[layer.weight]["A"] = (s / n).to(device=layer.weight.device, dtype=torch.float32)

    def _ensure_curvature(self) -> None:
        missing = [layer for layer in self.foof_layers() if "A" not in self.state[layer.weight]]
        self.refresh_curvature(missing)

    def _factor(self, weight: torch.Tensor) -> torch.Tensor:
        A = self.state[weight]["A"]
        cached = self._factors.get(weight)
        if cached is None or cached[0] is not A:  # a refreshed, imported or loaded A is a new tensor
            self._factors[weight] = (A, damped_cholesky(A, self.damping))
        return self._factors[weight][1]

    # ------------------------------------------------------------ hooks
    def before_forward(self, step: int, batch: Mapping[str, Any]) -> None:
        self._ensure_curvature()  # only layers without A: a cached or imported A is kept (x^r otherwise)

    def end_round(self) -> None:
        self.refresh_curvature()  # at x_i^K: uploaded for mixing and kept as next round's preconditioner

    # ------------------------------------------------------------ the step
    def update(self) -> None:
        self._ensure_curvature()  # a no-op inside the trainer (before_forward did it); for use outside it
        group_of = {id(p): group for group in self.param_groups for p in group["params"]}
        done = set()
        for layer in self.foof_layers():
            W, b = layer.weight, layer.bias
            if W.grad is None:
                continue
            group = group_of[id(W)]
            wd = group["weight_decay"]
            G_b = None if b is None else (torch.zeros_like(b) if b.grad is None else b.grad) + wd * b
            direction = foof_direction(augment(W.grad + wd * W, G_b), self._factor(W))
            cols = W[0].numel()
            W.add_(direction[:, :cols].reshape(W.shape).to(W.dtype), alpha=-group["lr"])
            done.add(id(W))
            if b is not None:
                b.add_(direction[:, cols].to(b.dtype), alpha=-group["lr"])
                done.add(id(b))
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and id(p) not in done:
                    p.add_(p.grad + group["weight_decay"] * p, alpha=-group["lr"])
