"""The trainer's half of ``batched_clients``: C of a round's clients trained together (fedhf/runtime/stacked_adapters.py).

Each client keeps everything it has when trained alone: its own data stream (the same batches, in the same
order), its optimizer and optimizer state, its correction, its state-sync warm start, its clipping, its message;
an optimizer's own passes over the model (Sophia's curvature probe, FOOF's statistics) route every row through
its client's copy.
Only the forward/backward is shared: one pass over the C clients' concatenated micro-batches, whose loss is the
sum of each client's own mean (over its label tokens or rows across the step's micro-batches, as
:meth:`FederatedTrainer._accumulate` weighs them), so each client's copy of the adapter receives exactly its own
gradient. The global model equals sequential training up to float rounding (the base runs on a larger batch).

What cannot be shared is refused when the trainer is built (:func:`check_batched_clients`), with the fix named.
Dropout draws its masks for the concatenated batch (same distribution, another random stream than sequential
clients), so bit-equality with sequential training needs a model without active dropout.
"""

from __future__ import annotations

from typing import List

import torch

from ..core.sums import RoundSums
from ..runtime.stacked_adapters import Routing, concat_batches, model_pad_id, per_client, row_losses, stacked_clients
from ..core.context import ClientContext
from ..runtime.model_outputs import logits_of, loss_items
from ..optim import ModelAccess
from ..sharing.plan import PERSONAL


def check_batched_clients(trainer) -> None:
    """Refuse, before any work, the settings under which clients cannot share a forward/backward."""
    args = trainer.args
    if args.batched_clients == 1:
        return
    from ..runtime.stacked_adapters import trainable_linears
    from ..core.params import federated_buffers

    trainable_linears(trainer.model)  # raises naming the modules that cannot be stacked
    problems = []
    if trainer.sharing.preset == "rolora" or trainer.algorithm.server_rule.aggregator.freezes_lora_a:
        problems.append("a LoRA factor frozen on the clients (`parameter_sharing='rolora'`, `server_rule='fedsvd'`)")
    if PERSONAL in trainer.sharing_roles.values():
        problems.append("personal tensors (`parameter_sharing`: each client would need its own copy loaded)")
    if federated_buffers(trainer.model):
        problems.append("the model has averaged buffers (BatchNorm statistics would mix the clients' rows)")
    if args.neftune_noise_alpha:
        problems.append("`neftune_noise_alpha` (its noise is drawn per forward pass)")
    if args.label_smoothing_factor:
        problems.append("`label_smoothing_factor` (the per-client loss is the model's plain loss)")
    if trainer.compute_loss_func is not None:
        problems.append("a `compute_loss_func` (the per-client loss is computed from the logits)")
    problems += _overridden_loss(type(trainer))
    if problems:
        raise ValueError(f"`batched_clients={args.batched_clients}` cannot train clients together with "
                         + "; ".join(problems) + ". Set `batched_clients=1` or change that setting.")


def _overridden_loss(cls: type) -> List[str]:
    """The shared pass computes each client's loss from the logits (the model's plain mean) and never calls
    ``compute_loss`` or ``training_step``; an override of either (a user's, or trl's SFTTrainer's: its ``dft`` loss,
    MoE auxiliary loss and token metrics) would be skipped silently, so it is refused."""
    from transformers import Trainer

    return [f"an overridden `{name}` ({getattr(cls, name).__qualname__}: the shared pass computes each client's "
            f"loss from the logits and would skip it; trl's SFTTrainer overrides both)"
            for name in ("compute_loss", "training_step") if getattr(cls, name) is not getattr(Trainer, name)]


def _random_state():
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None


def _set_random_state(state) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


class BatchedRound:
    """Mixed into :class:`fedhf.trainer.FederatedTrainer`."""

    def _train_clients_together(self, contexts: List[ClientContext], sums: RoundSums) -> None:
        args = self.args
        with stacked_clients(self.model, len(contexts)) as (routing, views):
            optimizers, random_states = [], []
            for c, (ctx, params) in enumerate(zip(contexts, views)):
                ctx.params = params  # the client's own copy of the adapters
                optimizers.append(self._begin_client(ctx, self._routed_access(ctx, routing, c, len(contexts))))
                random_states.append(_random_state())  # its own stream (seeded in _begin_client), kept apart
            streams = [self._client_batches(ctx.client_id, ctx.round) for ctx in contexts]
            losses = torch.zeros(len(contexts), dtype=torch.float64)
            for step in range(args.local_steps):
                micro = [[next(s) for _ in range(args.gradient_accumulation_steps)] for s in streams]
                for c, (optimizer, batches) in enumerate(zip(optimizers, micro)):
                    _set_random_state(random_states[c])  # e.g. Sophia's sampled labels: as if trained alone
                    optimizer.before_forward(step, batches[0])
                    random_states[c] = _random_state()
                losses += self._shared_backward(micro, routing)
                for ctx, optimizer in zip(contexts, optimizers):
                    self._optimizer_step(ctx, optimizer)  # ends with the client's zero_grad: the only grads there are
                self.loss_scale.update()  # fp16: one scale update for the shared backward
            for ctx, optimizer, loss in zip(contexts, optimizers, losses):
                optimizer.end_round()
                self._finish_client(ctx, optimizer, loss, {}, sums)

    def _routed_access(self, ctx: ClientContext, routing: Routing, client: int, copies: int) -> ModelAccess:
        """The client's ModelAccess with every row of a batch routed through its own copy (curvature passes)."""
        access = self._model_access(ctx)

        def routed(pass_):
            def run(batch):
                routing.only(client, copies, len(next(v for v in batch.values() if torch.is_tensor(v))))
                return pass_(batch)
            return run

        return ModelAccess(access.model, routed(access.loss), routed(access.logits), access.batches)

    def _shared_backward(self, micro: List[List[dict]], routing) -> torch.Tensor:
        """One backward per micro-batch over the clients' concatenated rows; returns each client's step loss
        (its mean over the step's micro-batches), shape (C,)."""
        shifted = self._loss_shifts_labels
        items = torch.tensor([max(sum(loss_items(b, shifted) for b in batches), 1) for batches in micro],
                             dtype=torch.float64)
        step_loss = torch.zeros(len(micro), dtype=torch.float64)
        pad_id = model_pad_id(self.model)
        for m in range(len(micro[0])):
            batch, rows = concat_batches([batches[m] for batches in micro], pad_id)
            routing.segments = rows.segments
            inputs = self._prepare_inputs(batch)
            labels = inputs.pop("labels")
            with self.autocast_smart_context_manager():
                logits = logits_of(self.model(**inputs))
            client_loss = per_client(row_losses(logits, labels, shifted), routing) / items.to(logits.device)
            self.accelerator.backward(client_loss.sum())
            step_loss += client_loss.detach().double().cpu()
        return step_loss
