"""What a federated local optimizer adds to ``torch.optim.Optimizer``: named parameters, the state Theta that
can be averaged or warm-started across clients, and model-aware curvature hooks.

Theta (docs/algorithms.md 2.15, 4.1) is the part of the optimizer state that describes the local geometry: Muon's
momentum of matrices, SOAP's factors L and R, Sophia's Hessian estimate h, FOOF's input covariances A, the
second moments of the Adam family. State-sync rules (:mod:`fedhf.sync`) move it between rounds and clients;
the drift metric Delta_D measures how far the clients' Theta are apart. Everything else in the state (first
moments, eigenbases, step counters) stays local and is reset with the optimizer.

Theta is a flat dict of tensors keyed ``"<state key>:<parameter name>"`` (for example
``"momentum_buffer:model.layer.0.lora_A.default.weight"``), so it sums, averages and checkpoints like any other
named tensors. ``import_theta(export_theta())`` is the identity.

The protocol of the local-optimizer axis is :class:`OptimizerHooks`: what the trainer calls on every local
optimizer, each with a no-op default. fedhf's own optimizers (:class:`FederatedOptimizer`) and ``torch.optim``
ones (wrapped in :class:`TorchOptimizer`) both implement it, so the trainer has no special case. Every optimizer
receives a :class:`ModelAccess` through :meth:`OptimizerHooks.attach` (Sophia's sampled-label backward and FOOF's
layer inputs use it) -- never through globals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import torch

from ..core.theta import GENERAL, NONNEGATIVE, split_theta_key, theta_key  # noqa: F401  (theta_key re-exported)
from .whole_state import StateOwner, export_whole_state, import_whole_state

TensorDict = Dict[str, torch.Tensor]
NamedParams = Iterable[Union[torch.Tensor, Tuple[str, torch.Tensor]]]


@dataclass
class ModelAccess:
    """The model-aware part of a client round, handed to optimizers with ``needs_model = True``.

    ``model``: the resident model (its trainable parameters are the optimizer's).
    ``loss(batch)``: the trainer's training loss of a batch (``compute_loss`` under autocast), differentiable.
    ``logits(batch)``: the model's logits for a batch with its labels removed, under autocast, differentiable.
    ``batches()``: a fresh pass over the client's local data (its own random stream), for curvature statistics.
    """

    model: torch.nn.Module
    loss: Callable[[Mapping[str, Any]], torch.Tensor]
    logits: Callable[[Mapping[str, Any]], torch.Tensor]
    batches: Callable[[], Iterator[Mapping[str, Any]]]


class OptimizerHooks:
    """The local-optimizer protocol: what the trainer calls around ``step``/``zero_grad``, with no-op defaults.

    ``theta_kinds`` declares the structure of each Theta state key (:mod:`fedhf.core.theta`: symmetric PSD,
    non-negative, general -- the default), beside the keys; compression and drift read it via :meth:`theta_kind`.
    """

    #: A warm start of Theta is possible (state-sync rules that import Theta need it).
    imports_theta = False
    #: :meth:`preconditioners` returns something (FedPM's preconditioned mixing needs it).
    exports_preconditioners = False
    #: The structure of each Theta state key; absent keys are general.
    theta_kinds: Mapping[str, str] = {}

    def export_theta(self) -> TensorDict:
        """Theta as named tensors (a copy); ``{}`` for an optimizer without one."""
        return {}

    def import_theta(self, theta: Mapping[str, torch.Tensor]) -> None:
        if theta:
            raise KeyError(f"{type(self).__name__} cannot import Theta (got {sorted(theta)[:3]}...)")

    @classmethod
    def theta_kind(cls, state_key: str) -> str:
        return cls.theta_kinds.get(state_key, GENERAL)

    def state_owners(self) -> List[StateOwner]:
        """The torch optimizers holding this optimizer's per-parameter state, each with its parameter -> name
        (what :meth:`export_state` reads). A wrapper that steps gathered copies has none to hand over."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot hand over its whole optimizer state (it steps copies of the parameters): "
            "use a state sync that keeps Theta only (`state_sync='persist_local'` without `keep='state'`) or "
            "`state_sync='reset'`.")

    def export_state(self) -> TensorDict:
        """The whole per-parameter state (moments, counters), keyed as Theta (fedhf/optim/whole_state.py)."""
        return export_whole_state(self.state_owners())

    def import_state(self, state: Mapping[str, torch.Tensor]) -> None:
        import_whole_state(self.state_owners(), state)

    def theta_structure(self, theta: Mapping[str, torch.Tensor]) -> Dict[str, str]:
        """The kind of every entry of ``theta`` (as exported by this optimizer)."""
        return {key: self.theta_kind(split_theta_key(key)[0]) for key in theta}

    def preconditioners(self) -> TensorDict:
        """Per weight name, the matrix P the optimizer right-multiplies that weight's (bias-augmented) gradient
        by the inverse of, at the end of the round (FOOF: A + lambda I). ``{}`` for most optimizers."""
        return {}

    def attach(self, access: ModelAccess) -> None:
        """Called by the trainer right after building, with the model-aware part of the client round."""

    def before_forward(self, step: int, batch: Mapping[str, Any]) -> None:
        """Called before the forward/backward of local step ``step`` (0-based) with its batch, while ``.grad``
        is empty: the place for curvature estimates that need their own backward pass."""

    def end_round(self) -> None:
        """Called after the last local step, before Theta is exported (FOOF refreshes its statistics here)."""

    def step_parts(self) -> Iterator:
        """``step()`` as parts: a generator that yields its Newton-Schulz requests and is sent their answers
        (fedhf/optim/newton_schulz_pool.py), so the clients of a batched chunk orthogonalise in one batched call.
        By default the whole step, with no request."""
        self.step()
        yield from ()


class FederatedOptimizer(torch.optim.Optimizer, OptimizerHooks):
    """Base of fedhf's own optimizers. Subclasses set ``theta_keys`` (per-parameter state keys forming Theta) or
    override :meth:`export_theta`/:meth:`import_theta`, and initialise state lazily *key by key* so an imported
    Theta survives the first step."""

    theta_keys: Tuple[str, ...] = ()
    imports_theta = True
    needs_model = False  # documentation for tests and readers: the trainer attaches every optimizer

    def __init__(self, params: NamedParams, defaults: Dict[str, Any]) -> None:
        named = [(item if isinstance(item, tuple) else (f"param{i}", item)) for i, item in enumerate(params)]
        self.param_names: Dict[torch.Tensor, str] = {p: n for n, p in named}
        self.model_access: Union[ModelAccess, None] = None
        super().__init__([p for _, p in named], defaults)

    # ---------------------------------------------------------------- the step
    @torch.no_grad()
    def step(self, closure=None):
        """torch's step protocol (an optional closure re-evaluates the loss with gradients); the update itself,
        from the ``.grad`` of the parameters, is the subclass's :meth:`update`."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.update()
        return loss

    def update(self) -> None:
        raise NotImplementedError

    @classmethod
    def state_bytes(cls, params: Mapping[str, torch.Tensor], **kwargs: Any) -> int:
        """The bytes of the state this optimizer holds for ``params`` (names -> tensors) built with ``kwargs``, at
        its largest (after the first steps), computed from shapes and dtypes (fedhf/optim/state_size.py)."""
        raise NotImplementedError(f"{cls.__name__} does not declare its state size")

    @classmethod
    def logits_pass(cls, **kwargs: Any) -> Optional[str]:
        """How this optimizer built with ``kwargs`` runs :attr:`ModelAccess.logits` (every position's logits, not cut
        to the labelled ones), which the memory plan counts: ``"backward"`` (differentiated: Sophia's GNB),
        ``"no_grad"`` (a forward only: FOOF's statistics), or None (never)."""
        return None

    @classmethod
    def unplanned_memory(cls, **kwargs: Any) -> Optional[str]:
        """What this optimizer built with ``kwargs`` holds that the memory plan cannot count, said in its notes."""
        return None

    def lazy_state(self, p: torch.Tensor, keys: Iterable[str]) -> Tuple[Dict[str, Any], torch.dtype]:
        """p's state with every key of ``keys`` present, and its dtype (fp32 for half-precision parameters, p's
        own from fp32 up). Missing keys start at zero one by one, so an imported Theta survives the first step."""
        state, dtype = self.state[p], torch.promote_types(p.dtype, torch.float32)
        for key in keys:
            if key not in state:
                state[key] = torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format)
        return state, dtype

    def state_owners(self) -> List[StateOwner]:
        return [(self, self.param_names)]

    # ---------------------------------------------------------------- Theta
    def named_params(self) -> List[Tuple[str, torch.Tensor]]:
        return [(self.param_names[p], p) for group in self.param_groups for p in group["params"]]

    def export_theta(self) -> TensorDict:
        out = {}
        for name, p in self.named_params():
            for key in self.theta_keys:
                if key in self.state.get(p, {}):
                    out[theta_key(key, name)] = self.state[p][key].detach().float().clone()
        return out

    def import_theta(self, theta: Mapping[str, torch.Tensor]) -> None:
        by_name = dict(self.named_params())
        for key, value in theta.items():
            state_key, name = split_theta_key(key)
            if name not in by_name or state_key not in self.theta_keys:
                raise KeyError(f"{type(self).__name__} has no Theta entry {key!r}")
            p = by_name[name]
            self.state[p][state_key] = value.detach().to(device=p.device, dtype=torch.float32).clone()

    # ---------------------------------------------------------------- model-aware hooks
    def attach(self, access: ModelAccess) -> None:
        self.model_access = access


class TorchOptimizer(OptimizerHooks):
    """A ``torch.optim`` optimizer behind the protocol: it steps as itself; its Theta (``theta_keys`` per state,
    docs/algorithms.md 2.15: AdamW -> v) is exported for the drift metric only -- it cannot be warm-started."""

    theta_kinds = {"exp_avg_sq": NONNEGATIVE}

    def __init__(self, optimizer: torch.optim.Optimizer, param_names: Mapping[torch.Tensor, str],
                 theta_keys: Tuple[str, ...] = ()) -> None:
        self.optimizer, self.param_names, self.theta_keys = optimizer, dict(param_names), tuple(theta_keys)

    @property
    def state(self):
        return self.optimizer.state

    def state_owners(self) -> List[StateOwner]:
        return [(self.optimizer, self.param_names)]

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self, closure=None):
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def export_theta(self) -> TensorDict:
        return {theta_key(key, self.param_names[p]): state[key].detach().float().clone()
                for key in self.theta_keys for p, state in self.optimizer.state.items()
                if key in state and p in self.param_names}
