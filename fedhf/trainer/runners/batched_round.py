"""The runner of ``batched_clients``: C of a round's clients trained together (fedhf/runtime/stacked_adapters.py).

Each client keeps everything it has when trained alone: its own data stream (the same batches, in the same
order), its optimizer and optimizer state, its correction, its state-sync warm start, its clipping, its message;
an optimizer's own passes over the model (Sophia's curvature probe, FOOF's statistics) route every row through
its client's copy.
Only the forward/backward is shared: one pass over the C clients' concatenated micro-batches, whose loss is the
sum of each client's own mean (over its label tokens or rows across the step's micro-batches, as
:meth:`fedhf.trainer.runners.client_round.ClientRound.accumulate` weighs them), so each client's copy of the adapter receives exactly its own
gradient. The global model equals sequential training up to float rounding (the base runs on a larger batch).
The clients' optimizer steps run together where they can share work: BatchedMuon's Newton-Schulz iterations of all
the chunk's clients in one batched call (fedhf/optim/newton_schulz_pool.py). Personalised evaluation runs C
clients' held-out rows per stacked forward (:meth:`BatchedClients.evaluate_clients`).

What cannot be shared is refused when the trainer is built (fedhf/trainer/config/combinations/), with the fix named.
Dropout draws its masks for the concatenated batch from the chunk's own random stream (seeded per chunk, continued
across its local steps: fresh masks at every step), the same distribution as sequential clients but another stream,
so bit-equality with sequential training needs a model without active dropout.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ...core.schedule import stream_seed
from ...core.sums import RoundSums
from ...runtime.stacked_adapters import (Routing, StackedClients, concat_batches, model_pad_id, per_client, row_losses,
                                        stacked_clients, to_device)
from ...core.context import ClientContext
from ...runtime.labelled_logits import at_labelled_positions, row_losses_at
from ...runtime.model_outputs import logits_of, loss_items
from ...optim import ModelAccess
from ..hooks.personal_eval import held_out_rows
from .base import Runner


SHARED_PASS_STREAM = 4  # streams 1-3 are each client's own (dropout and curvature draws, its batches, its passes)


def _random_state():
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None


def _set_random_state(state) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def shared_pass_state(seed: int, round_index: int, first_client: int):
    """The random state the chunk's shared forward/backward starts from: its own stream (seed, round, the chunk's
    first client, SHARED_PASS_STREAM), apart from every client's stream (its dropout masks span the chunk's rows)."""
    saved = _random_state()
    torch.manual_seed(stream_seed(seed, round_index, first_client, SHARED_PASS_STREAM))
    state = _random_state()
    _set_random_state(saved)
    return state


class BatchedClients(Runner):
    """The runner for ``batched_clients = C > 1``: chunks of C clients, each with its own copy of the adapters."""

    def __init__(self, trainer) -> None:
        super().__init__(trainer)
        self.size = trainer.args.batched_clients
        self.stacks = {}  # the stacked modules by number of copies, built once and reloaded per chunk

    def train_chunk(self, run, contexts: List[ClientContext], sums: RoundSums) -> None:
        """No personal tensors here (refused): nothing per client to load."""
        trainer = self.trainer
        with stacked_clients(trainer.model, len(contexts), self.stacks) as stack:
            routing = stack.routing
            optimizers, random_states = [], []
            for c, (ctx, params) in enumerate(zip(contexts, stack.views)):
                ctx.params = params  # the client's own copy of the adapters
                optimizers.append(trainer._begin_client(ctx, self._routed_access(ctx, routing, c, len(contexts))))
                random_states.append(_random_state())  # its own stream (seeded in _begin_client), kept apart
            shared = [shared_pass_state(trainer.args.seed, contexts[0].round, contexts[0].client_id)]

            def before_forward(step, optimizers, micro):
                # The shared pass (its dropout) continues its own stream: saved where the last step left it, set
                # again after the clients' hooks, so each step draws new masks (not a client's restored state).
                if step:
                    shared[0] = _random_state()
                for c, (optimizer, batches) in enumerate(zip(optimizers, micro)):
                    _set_random_state(random_states[c])  # e.g. Sophia's sampled labels: as if trained alone
                    optimizer.before_forward(step, batches[0])
                    random_states[c] = _random_state()
                _set_random_state(shared[0])

            losses = trainer.client_round.steps_together(
                contexts, optimizers, lambda micro: self._shared_backward(micro, stack), before_forward)
            for ctx, optimizer, loss in zip(contexts, optimizers, losses):
                trainer._finish_client(ctx, optimizer, loss, trainer.plan.buffers, sums)

    def _routed_access(self, ctx: ClientContext, routing: Routing, client: int, copies: int) -> ModelAccess:
        """The client's ModelAccess with every row of a batch routed through its own copy (curvature passes)."""
        access = self.trainer.client_data.model_access(ctx)

        def routed(pass_):
            def run(batch):
                routing.only(client, copies, len(next(v for v in batch.values() if torch.is_tensor(v))))
                return pass_(batch)
            return run

        return ModelAccess(access.model, routed(access.loss), routed(access.logits), access.batches)

    def _shared_backward(self, micro: List[List[dict]], stack: StackedClients) -> torch.Tensor:
        """One backward per micro-batch over the clients' concatenated rows, then each client's gradient handed
        to its parameters; returns each client's step loss (its mean over the step's micro-batches), shape (C,),
        on the model's device (read once per client at the end of its round, not per step)."""
        trainer = self.trainer
        shifted = trainer._loss_shifts_labels
        items = torch.tensor([max(sum(loss_items(b, shifted) for b in batches), 1) for batches in micro],
                             dtype=torch.float64)
        step_loss = 0.0
        pad_id = model_pad_id(trainer.model)
        for m in range(len(micro[0])):
            batch, rows = concat_batches([batches[m] for batches in micro], pad_id)
            stack.routing.route(rows.segments)
            step_loss = step_loss + self.fused_pass(batch, stack, items)
        stack.grads_to_clients()
        return step_loss

    def fused_pass(self, batch: dict, stack: StackedClients, items: torch.Tensor) -> torch.Tensor:
        """The forward and backward of the C clients' concatenated (host) ``batch``, routed by ``stack.routing``;
        returns each client's loss (its summed loss over ``items``, its label tokens or rows), detached, (C,).
        Its aten ops do not grow with C (benchmarks/batched_clients.py counts them): one batched matmul per
        stacked linear, fixed-size gathers, one index_add for the per-client sums, no read of the device."""
        summed = self.client_losses(batch, stack.routing)
        client_loss = summed / to_device(items, summed.device)
        self.trainer.accelerator.backward(client_loss.sum())
        return client_loss.detach().double()

    def client_losses(self, batch: dict, routing: Routing) -> torch.Tensor:
        """Each client's loss summed over its rows of the concatenated (host) ``batch`` (fp32, (C,)): one forward,
        the head at the labelled positions when the trainer projects only those (chosen on the host)."""
        trainer = self.trainer
        if trainer.labelled_logits:
            batch = at_labelled_positions(batch)
        inputs = trainer._prepare_inputs(batch)
        labels, shift_labels = inputs.pop("labels"), inputs.pop("shift_labels", None)
        with trainer.autocast_smart_context_manager():
            logits = logits_of(trainer.model(**inputs))
        losses = (row_losses(logits, labels, trainer._loss_shifts_labels) if shift_labels is None
                  else row_losses_at(logits, shift_labels))
        return per_client(losses, routing)

    def evaluate_clients(self, rows_of: Dict[int, Sequence[int]]) -> Optional[Dict[int, Dict[str, float]]]:
        """Personalised evaluation (fedhf/trainer/hooks/personal_eval.py) of C clients at a time: each client's held-out
        rows, batched as Trainer's evaluation loop batches them (its test DataLoader), run through the client's own
        copy of the adapters, the C clients' batches in one stacked forward per step (a client whose rows ran out
        gets an empty block). Its ``loss``: the mean over its rows of its batches' mean losses, as Trainer's loop
        averages. Every copy holds the global adapter, which is each client's own model here: batched clients
        keep no personal tensors (refused). None with ``compute_metrics``, which needs each client's predictions:
        then the clients are evaluated one at a time."""
        trainer = self.trainer
        if trainer.compute_metrics is not None:
            return None
        clients, metrics, training = list(rows_of), {}, trainer.model.training
        shifted, pad_id = trainer._loss_shifts_labels, model_pad_id(trainer.model)
        trainer.model.eval()
        try:
            for start in range(0, len(clients), self.size):
                chunk = clients[start:start + self.size]
                loaders = [iter(trainer.get_test_dataloader(held_out_rows(trainer, rows_of[c]))) for c in chunk]
                totals = 0.0
                with stacked_clients(trainer.model, len(chunk), self.stacks) as stack, torch.no_grad():
                    while True:
                        batches = [next(loader, None) for loader in loaders]
                        present = [b for b in batches if b is not None]
                        if not present:
                            break
                        batch, _ = concat_batches(present, pad_id)
                        rows = [0 if b is None else len(next(v for v in b.values() if torch.is_tensor(v)))
                                for b in batches]
                        items = torch.tensor([max(loss_items(b, shifted), 1) if b is not None else 1
                                              for b in batches], dtype=torch.float64)
                        stack.routing.route(row_blocks(rows))
                        summed = self.client_losses(batch, stack.routing).double()
                        weights = torch.tensor(rows, dtype=torch.float64) / items  # n_b x (batch mean)
                        totals = totals + summed * to_device(weights, summed.device)
                for c, total in zip(chunk, totals.tolist()):
                    metrics[c] = {"loss": total / len(rows_of[c])}
        finally:
            trainer.model.train(training)
        return metrics


def row_blocks(rows: Sequence[int]) -> List[Tuple[int, int]]:
    """Client-major segments of ``rows[c]`` rows each (0: an empty block)."""
    starts = [0]
    for n in rows:
        starts.append(starts[-1] + n)
    return list(zip(starts[:-1], starts[1:]))
