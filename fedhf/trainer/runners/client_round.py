"""One client's round, written once for every runner (fedhf/trainer/runners/base.py): :class:`ClientRound`'s
:meth:`~ClientRound.begin` (its correction, seeded streams and optimizer), :meth:`~ClientRound.steps` (K local steps:
the optimizer's ``before_forward``, the backward the runner gives, then each client's step -- clipping, the
correction's hooks around the optimizer step) and :meth:`~ClientRound.finish` (its messages, through the round hooks,
into the round's sums, or its exclusion).

How the clients of a local step are stepped is chosen once per run (:meth:`ClientRound.prepare`), as the runner is
chosen once per trainer: plainly (each client's ``optimizer.step()``), under fp16 loss scaling
(fedhf/trainer/runners/loss_scaling.py), or pooled for a batched chunk (its clients' Newton-Schulz iterations in one
batched call, fedhf/optim/newton_schulz_pool.py); a run that uses neither pays for neither.

The runners reach a client's round through the trainer's ``_begin_client``, ``_local_steps`` and ``_finish_client``
(as Trainer's loop reaches ``training_step``), which delegate here once, so a subclass of the trainer may override
them; ``finish`` asks the trainer's ``_faulty`` whether the client may enter the round. The backward always goes
through the trainer's ``training_step`` (and so ``compute_loss``).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence

import torch
from transformers.utils import logging

from ...core.context import ClientContext
from ...core.message import Message
from ...core.params import TensorDict, difference, snapshot
from ...core.schedule import stream_seed
from ...core.sums import RoundSums
from ...optim import ModelAccess, OptimizerHooks
from ...optim.newton_schulz_pool import StepsTogether
from ...optim.whole_matrices import over_shards
from ...runtime.labelled_logits import at_labelled_positions
from ...runtime.model_outputs import loss_items
from ..config.privacy_settings import dp_on
from ..hooks.base import ClientMessages
from .labelled_positions import own_loss
from .loss_scaling import LossScale

logger = logging.get_logger(__name__)
Backward = Callable[[List[List[dict]]], Sequence]  # each client's step micro-batches -> each client's step loss


def faulty(loss_sum: float, delta: TensorDict, bound: Optional[float],
           total: Callable[[torch.Tensor], torch.Tensor] = lambda partial: partial) -> Optional[str]:
    """Why a client's result cannot enter the round (None: it can). ``total``: a sum over the processes' shards
    of the squared norm (FSDP, fedhf/runtime/sharded.py)."""
    if not math.isfinite(loss_sum):
        return "non-finite loss"
    squared = total(sum(d.double().pow(2).sum() for d in delta.values()))
    if not torch.isfinite(squared):
        return "non-finite update"
    if bound is not None and squared.sqrt() > bound:
        return f"update norm {squared.sqrt():.3g} > max_update_norm {bound}"
    return None


def each_before_forward(step: int, optimizers: Sequence[OptimizerHooks], micro: List[List[dict]]) -> None:
    """The optimizers' per-step hook (curvature refreshes) on each client's first micro-batch of the step."""
    for optimizer, batches in zip(optimizers, micro):
        optimizer.before_forward(step, batches[0])


def _zero_grads(optimizers: Sequence[OptimizerHooks]) -> None:
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)


def sent_update(own: Message, delta: TensorDict) -> TensorDict:
    """The client's Delta_i as the round hooks left its message: its ``dx`` (sent as w_i Delta_i) over the w_i it
    sent, in the dtypes of ``delta`` (exact without a hook: w_i is 1 or a row count, and w_i x float32 is exact in
    float64); nothing when a hook sent w_i = 0 (the client dropped from the mean is dropped from the gathered ones)."""
    weight = float(own.tensors["w"]) if "w" in own.tensors else 0.0
    if weight == 0.0:
        return {}
    return {name: (own.tensors[f"dx.{name}"] / weight).to(delta[name].dtype)
            for name in delta if f"dx.{name}" in own.tensors}


class ClientRound:
    """A client's round: :meth:`begin`, :meth:`steps` (or :meth:`steps_together` for a batched chunk), :meth:`finish`."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        # each training client's correction state: what its client_begin returned, handed back to its step hooks
        # and its client_end (a batched chunk trains several clients at once)
        self.correction_rounds: Dict[int, object] = {}
        self.loss_scale: Optional[LossScale] = None
        self.step_clients = self._plain_steps

    def prepare(self, loss_scale: LossScale, together: bool) -> None:
        """The run's step pipeline, chosen once when it starts (the fp16 scaler is accelerate's, known only then):
        pooled when the runner trains clients ``together`` (a batched chunk; loss scaling inside it), else
        loss-scaled when fp16 made a scaler, else plain."""
        self.loss_scale = loss_scale
        if together:
            self.step_clients = self._pooled_steps
        elif loss_scale.scaler is not None:
            self.step_clients = self._scaled_steps
        else:
            self.step_clients = self._plain_steps

    def begin(self, ctx: ClientContext, access: Optional[ModelAccess] = None) -> OptimizerHooks:
        """The client's correction, seeded streams and optimizer (with its state-sync warm start and the
        model-aware part of its round: ``access``, by default the trainer's ``client_data.model_access``)."""
        trainer = self.trainer
        algo = trainer.algorithm
        trainer.plan.begin_client(ctx.client_id)  # lora_client_ranks: its first r_i components only
        self.correction_rounds[ctx.client_id] = algo.correction.client_begin(ctx)
        torch.manual_seed(stream_seed(trainer.args.seed, ctx.round, ctx.client_id, 1))  # dropout, curvature draws
        # Train mode before anything runs the model: curvature hooks run before training_step (which would set
        # it), and the first client after an evaluation would otherwise estimate curvature in eval mode.
        trainer.model.train()
        optimizer = over_shards(algo.local_optimizer, trainer.plan.trained(ctx.params),  # shared + personal; under
                                ctx.local_lr, trainer.shards)  # FSDP over this process's shards (optim/whole_matrices.py)
        algo.state_sync.client_begin(ctx, trainer.plan.theta_target(optimizer))  # RoLoRA: the trained factor's Theta
        optimizer.attach(access or trainer.client_data.model_access(ctx))
        return optimizer

    def steps(self, ctx: ClientContext, optimizer: OptimizerHooks, backward: Backward) -> float:
        """A client trained alone: its K local steps over ``backward`` (the runner's); returns its summed loss."""
        trainer = self.trainer
        trainer.optimizer = optimizer  # Trainer's attribute, as in its own loop
        loss_sum = self.steps_together([ctx], [optimizer], backward)[0]
        trainer.optimizer = None
        return float(loss_sum)

    def steps_together(self, contexts: Sequence[ClientContext], optimizers: Sequence[OptimizerHooks],
                       backward: Backward, before_forward=each_before_forward) -> List:
        """K local steps of the clients trained together (one, or a batched chunk); returns each client's summed
        loss (read from the model's device once per client, not once per step: a read waits for the device's
        queued work). A local step is one optimizer step over ``gradient_accumulation_steps`` micro-batches;
        curvature refreshes (on the first micro-batch), clipping and corrections act once per step."""
        trainer = self.trainer
        args = trainer.args
        streams = [trainer.client_data.batches(ctx.client_id, ctx.round) for ctx in contexts]
        totals = [0.0] * len(contexts)
        for step in range(args.local_steps):
            micro = [[next(s) for _ in range(args.gradient_accumulation_steps)] for s in streams]
            before_forward(step, optimizers, micro)
            for c, loss in enumerate(backward(micro)):
                totals[c] = totals[c] + loss
            self.step_clients(contexts, optimizers)  # ends with each client's zero_grad
        for optimizer in optimizers:
            optimizer.end_round()
        return totals

    # ---------------------------------------------------------------- the step pipelines (one chosen per run)
    # Each steps every client of a local step on its own gradient and touches only its own tensors and state (so
    # the order is free), then clears the gradients.
    def _plain_steps(self, contexts: Sequence[ClientContext], optimizers: Sequence[OptimizerHooks]) -> None:
        """Each client's whole step, as it is."""
        for ctx, optimizer in zip(contexts, optimizers):
            self._client_step(ctx, optimizer, self._trained(ctx))
        _zero_grads(optimizers)

    def _scaled_steps(self, contexts: Sequence[ClientContext], optimizers: Sequence[OptimizerHooks]) -> None:
        """fp16: each client's step on unscaled gradients, skipped when one overflowed; then one scale update
        for the local step (fedhf/trainer/runners/loss_scaling.py)."""
        for ctx, optimizer in zip(contexts, optimizers):
            trained = self._trained(ctx)
            self.loss_scale.step(trained, lambda ctx=ctx, optimizer=optimizer, trained=trained:
                                 self._client_step(ctx, optimizer, trained))
        _zero_grads(optimizers)
        self.loss_scale.update()  # fp16: one scale update per step, for every client of the step

    def _pooled_steps(self, contexts: Sequence[ClientContext], optimizers: Sequence[OptimizerHooks]) -> None:
        """A batched chunk: each client runs up to its Newton-Schulz iterations (Muon), which then run as one
        batched call for all of them (fedhf/optim/newton_schulz_pool.py), and each finishes; each started under
        the fp16 loss scale (a no-op without fp16). A client alone (the last chunk) steps whole."""
        together, alone = StepsTogether(), len(contexts) == 1
        for ctx, optimizer in zip(contexts, optimizers):
            trained = self._trained(ctx)
            parts = self._client_step_parts(ctx, optimizer, trained, alone)
            self.loss_scale.step(trained, lambda parts=parts: together.start(parts))
        together.finish()
        _zero_grads(optimizers)
        self.loss_scale.update()

    def _trained(self, ctx: ClientContext) -> List[torch.Tensor]:
        return list(self.trainer.plan.trained(ctx.params).values())

    def _client_step(self, ctx: ClientContext, optimizer: OptimizerHooks, trained: List[torch.Tensor]) -> None:
        """The client's step: clip its gradient, then the correction's hooks around its optimizer's step (see
        fedhf.corrections)."""
        correction_round = self._before_step(ctx, trained)
        optimizer.step()
        self._after_step(ctx, correction_round)

    def _client_step_parts(self, ctx: ClientContext, optimizer: OptimizerHooks, trained: List[torch.Tensor],
                           alone: bool):
        """:meth:`_client_step` as parts (a generator): the optimizer whole when ``alone``, else its
        :meth:`~fedhf.optim.OptimizerHooks.step_parts`."""
        correction_round = self._before_step(ctx, trained)
        if alone:
            optimizer.step()
        else:
            yield from optimizer.step_parts()
        self._after_step(ctx, correction_round)

    def _before_step(self, ctx: ClientContext, trained: List[torch.Tensor]):
        trainer = self.trainer
        max_norm = trainer.args.max_grad_norm
        if max_norm is not None and max_norm > 0:  # Trainer's meaning: <= 0 = no clipping
            trainer.shards.clip_grad_norm_(trained, max_norm)  # sharded: the whole gradient's norm
        correction_round = self.correction_rounds[ctx.client_id]
        trainer.algorithm.correction.before_step(ctx, correction_round)
        return correction_round

    def _after_step(self, ctx: ClientContext, correction_round) -> None:
        self.trainer.algorithm.correction.after_step(ctx, correction_round)
        self.trainer.plan.after_step(ctx.client_id)  # lora_client_ranks: nothing revives the components beyond r_i

    def accumulate(self, micro_batches: List[dict]):
        """Gradients of one optimizer step over G micro-batches, equal to those of one backward over their union;
        returns the union's loss (a float64 tensor on the model's device, or 0.0 when nothing was run).

        Which mean: the model's own loss is a mean over its micro-batch; each micro-batch is weighted by its share
        of the union's items, so the step sees the union's mean. Items are label tokens != -100 when labels are
        per token (causal LMs: the per-token mean of the union, counted after the shift a causal-LM loss makes;
        token classifiers likewise without the shift) and rows otherwise (sequence/image classifiers: the per-row
        mean). The weight goes through the divisor Trainer's ``training_step`` applies (a plain 1/G would
        overweight a short micro-batch). With G = 1 nothing changes.

        A micro-batch without a single item (every label -100) has nothing to learn and is not run (the model's
        mean over it would be 0/0 = NaN and exclude the client). A step whose micro-batches all lack one leaves
        every gradient None (the optimizers skip such parameters) and adds 0 to the summed loss, which the round
        still divides by local_steps (the same as for G > 1).
        """
        trainer = self.trainer
        shifted = trainer._loss_shifts_labels
        if len(micro_batches) == 1:
            if loss_items(micro_batches[0], shifted) == 0:
                return 0.0
            return trainer.training_step(trainer.model, self._head_at_labels(micro_batches[0])).double()
        # a compute_loss_func with G > 1 is refused when the trainer is built (fedhf/trainer/config/combinations/)
        items = [loss_items(batch, shifted) for batch in micro_batches]
        loss = 0.0
        for batch, n in zip(micro_batches, items):
            if n == 0:  # nothing to learn from (all labels masked): its mean would be NaN
                continue
            trainer.current_gradient_accumulation_steps = sum(items) / n
            loss = loss + trainer.training_step(trainer.model, self._head_at_labels(batch)).double()
        trainer.current_gradient_accumulation_steps = 1
        return loss

    def _head_at_labels(self, batch: dict) -> dict:
        """The host batch with its labelled positions chosen (fixed-size gathers, fedhf/runtime/labelled_logits.py)
        when the trainer projects only those: chosen here, before the batch moves, the device is never read for a
        shape (``compute_loss`` leaves positions already chosen alone). A subclass's ``compute_loss`` override gets the
        batch whole, as under Trainer; one that calls ``super().compute_loss`` gets the cut there."""
        return at_labelled_positions(batch) if self.trainer.labelled_logits and own_loss(self.trainer) else batch

    def finish(self, ctx: ClientContext, optimizer: OptimizerHooks, loss_sum: float,
               buffers: Dict[str, torch.Tensor], sums: RoundSums) -> None:
        """The client's messages, through the round hooks, into the round's sums (or its exclusion)."""
        trainer = self.trainer
        algo, plan = trainer.algorithm, trainer.plan
        correction_round = self.correction_rounds.pop(ctx.client_id)
        delta = difference(ctx.params, ctx.global_params)
        problem = trainer._faulty(loss_sum, delta)
        if problem:
            # Excluded from every sum (and its persistent state is left as it was), so it cannot poison the round.
            if dp_on(trainer.args):  # which client, and why, is a fact of its data that the noise does not cover
                logger.warning("round %d: a client was excluded (not logged which, nor why, under DP)", ctx.round + 1)
            else:
                logger.warning("round %d: client %d excluded (%s)", ctx.round + 1, ctx.client_id, problem)
            sums.add("excluded", 1.0)
            return
        plan.keep_personal(trainer.client_store, ctx.client_id)
        own = Message().put("dx", delta, scale=ctx.weight,  # the trainer's own message: un-namespaced keys
                            nbytes=plan.sent_bytes(delta))  # RoLoRA: the frozen factor's zeros are not sent
        own.put("buf", snapshot(buffers), scale=ctx.weight)  # averaged buffers (none: nothing)
        components = {"correction": algo.correction.client_end(ctx, correction_round)}
        theta = plan.shared_theta(optimizer.export_theta())
        # a rule that keeps the whole optimizer state (persist_local keep="state", desloc) gets it instead of Theta
        kept = theta if algo.state_sync.moves == "theta" else plan.shared_theta(optimizer.export_state())
        components["sync"] = algo.state_sync.client_end(ctx, kept, optimizer.theta_structure(kept))
        components["server"] = algo.server_rule.client_end(ctx, optimizer)
        own.put_scalar("w", ctx.weight).put_scalar("n", 1.0)
        own.put_scalar("loss", float(loss_sum) / trainer.args.local_steps * ctx.weight)
        sent = trainer.hooks.on_client_message(trainer, ctx, ClientMessages(own, components, theta))
        update = sent_update(sent.own, delta)
        if update:  # robust aggregators: each Delta_i as the round hooks sent it (none when a hook holds it back)
            trainer.gathering.keep(sums, ctx.client_id, update)
        sums.add_message(sent.own)
        for namespace, message in sent.components.items():
            sums.add_message(message, namespace)
        sums.add("uplink_bytes", sent.nbytes)
