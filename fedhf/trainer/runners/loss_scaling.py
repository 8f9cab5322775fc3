"""fp16 loss scaling around fedhf's own local steps.

Under ``fp16=True`` on a GPU, accelerate makes a ``torch.amp.GradScaler`` and its ``backward`` runs
``scaler.scale(loss).backward()``: every gradient arrives multiplied by the scale S (65,536 at first). The dynamic
loss scaling of Micikevicius et al. 2018 ("Mixed Precision Training", ICLR, arXiv:1710.03740) then needs, per
optimizer step: the gradients divided by S before anything reads them (clipping, corrections, the optimizer), the
step skipped when a gradient overflowed to inf/nan, and S updated once (halved after an overflow, doubled after
``growth_interval`` clean steps).

fedhf's local optimizers are not accelerate-prepared optimizers, so the trainer drives the scaler itself, through
its public protocol: ``scaler.step(x)`` unscales the gradients of ``x.param_groups`` and calls ``x.step()`` only
when they are finite; ``scaler.update()`` once per local step. ``x`` here is the client's trained tensors with the
client's whole step (clip, correction hooks, optimizer) as its ``step``. With ``batched_clients`` the clients of a
chunk share a backward, so each client is stepped (or skipped) on its own gradients and the scale is updated once
for the shared step, as torch does for several optimizers in one iteration.

What a skipped step means for a client: it still counts as one of its K local steps (its batch is used, and
step-indexed schedules such as Sophia's curvature refresh go on), but nothing of the step runs -- no clipping, no
correction hooks, no optimizer step -- so the optimizer's state and its own counters (Adam's and Sophia's step,
SOAP's preconditioner schedule) are left as they were, as ``GradScaler.step`` leaves a torch optimizer. The
gradient is then cleared. Overflows happen in the first steps of a run, while S falls to a usable value; the
scaler's state is one per run (it is accelerate's) and is kept in round checkpoints.

Several processes that train different clients (torchrun without ``client_parallel``) each drive their own
scaler, which sees only its own clients' overflows. After each round they agree on one state (:meth:`LossScale.agree`):
the smallest scale of any process and the smallest growth count, so that no process keeps a scale another found to
overflow, every process starts the next round from the same state, and the checkpoint's one copy (process 0's) is
the run's. Under ``client_parallel`` every process steps on the same gradients, so the states already agree.

accelerate makes no scaler on the CPU, and fedhf refuses ``fp16=True`` there when the config is built
(fedhf/trainer/config/config_checks.py names bf16 as the fix), so on the CPU every step just runs.
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Optional

import torch


class _ClientStep:
    """What ``GradScaler.step`` needs of an optimizer: the parameter groups whose ``.grad`` it unscales and checks,
    and ``step()``, called only when they are finite."""

    def __init__(self, params: List[torch.Tensor], step: Callable[[], None]) -> None:
        self.param_groups = [{"params": params}]
        self._step = step

    def step(self) -> None:
        self._step()


class LossScale:
    """accelerate's ``GradScaler`` (None without fp16: then a step just runs) around the clients' steps."""

    def __init__(self, scaler: Optional[torch.amp.GradScaler]) -> None:
        self.scaler = scaler
        # Alive until update(): the scaler keeps each step's record under id(), which a freed object could reuse.
        self._stepped: List[_ClientStep] = []

    def step(self, params: Iterable[torch.Tensor], step: Callable[[], None]) -> None:
        """Run ``step`` on unscaled gradients, or skip it when one of them is inf/nan."""
        if self.scaler is None:  # no fp16: the step just runs (the local loop's every step)
            step()
            return
        with_grad = [p for p in params if p.grad is not None]
        if not with_grad:  # no gradient: nothing scaled to check
            step()
            return
        client = _ClientStep(with_grad, step)
        self._stepped.append(client)
        self.scaler.step(client)

    def agree(self, processes: int, device: torch.device) -> None:
        """Once per round, on every process: the smallest scale and growth count of all processes' scalers, on
        each (one all-reduce on ``device``, the model's: NCCL reduces GPU tensors only). Taking the minimum keeps
        the back-off of any process that overflowed; it can only delay the next growth."""
        if self.scaler is None or processes == 1 or not self.scaler.is_enabled():
            return
        state = self.scaler.state_dict()
        agreed = torch.tensor([state["scale"], state["_growth_tracker"]], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
        self.scaler.load_state_dict({**state, "scale": agreed[0].item(), "_growth_tracker": int(agreed[1].item())})

    def update(self) -> None:
        """Once per local step, after every client of the step: the next scale."""
        if self._stepped:
            self.scaler.update()
        self._stepped = []
