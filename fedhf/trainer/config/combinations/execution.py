"""Refused combinations of how clients are run: micro-batches of one local step (gradient accumulation), clients
trained together (``batched_clients``), split over processes (``client_parallel``) or sharded (FSDP). The last
three are groups: one setting's problems in one message, with its head and fix in :data:`GROUPS`."""

from __future__ import annotations

from typing import Dict, List

from transformers import Trainer

from ....compression import parse_plan
from ....core.params import federated_buffers
from ....sharing.alternating import ROLORA
from ....sharing.plan import PERSONAL
from .refusal import Refusal, Setup, batched, sharded


def _overridden_loss(s: Setup) -> List[str]:
    """The shared pass computes each client's loss from the logits (the model's plain mean) and steps the chunk's
    clients together: it never calls ``compute_loss``, ``training_step`` or the trainer's per-client
    ``_local_steps``; an override of any (a user's, or trl's SFTTrainer's: its ``dft`` loss, MoE auxiliary loss and
    token metrics) would be skipped silently, so it is refused. The trainer's own methods (``s.trainer_class``'s,
    handed in by the trainer) are the shared pass's."""
    cls = type(s.trainer)
    return [name for name in ("compute_loss", "training_step", "_local_steps")
            if getattr(cls, name) not in (getattr(Trainer, name, None), getattr(s.trainer_class, name))]


def _overridden_text(s: Setup) -> str:
    cls = type(s.trainer)
    return "; ".join(f"an overridden `{name}` ({getattr(cls, name).__qualname__}: the shared pass "
                     + ("steps the chunk's clients together and would skip it)" if name == "_local_steps" else
                        "computes each client's loss from the logits and would skip it; trl's SFTTrainer overrides "
                        "both)")
                     for name in _overridden_loss(s))


def _stackable(model) -> None:
    from ....runtime.stacked_adapters import trainable_linears

    trainable_linears(model)


ACCUMULATION: List[Refusal] = [
    # micro-batches of one local step (fedhf/trainer/runners/client_round.py, ``accumulate``)
    Refusal(lambda s: s.args.gradient_accumulation_steps > 1 and (s.compute_loss_func is not None
                                                                  or s.loss_is_scaled_for_ga),
            lambda s: f"`gradient_accumulation_steps={s.args.gradient_accumulation_steps}` weights each micro-batch "
                      "by its share of the union's items, which needs the model's own mean loss; a "
                      "`compute_loss_func` (or a loss already scaled for accumulation) cannot be weighted so",
            "use gradient_accumulation_steps=1 and a larger per_device_train_batch_size"),
]

ROWS: List[Refusal] = [
    # batched clients: one message for all the settings that stop clients from sharing a forward/backward
    Refusal(batched, check=lambda s: _stackable(s.model)),  # names the modules that cannot be stacked
    Refusal(lambda s: batched(s) and (s.sharing.preset == ROLORA or s.rule.aggregator.freezes_lora_a),
            lambda s: "a LoRA factor frozen on the clients (`parameter_sharing='rolora'`, `server_rule='fedsvd'`)",
            group="batched_clients"),
    Refusal(lambda s: batched(s) and PERSONAL in s.sharing_roles.values(),
            lambda s: "personal tensors (`parameter_sharing`: each client would need its own copy loaded)",
            group="batched_clients"),
    Refusal(lambda s: batched(s) and bool(federated_buffers(s.model)),
            lambda s: "the model has averaged buffers (BatchNorm statistics would mix the clients' rows)",
            group="batched_clients"),
    Refusal(lambda s: batched(s) and bool(s.args.neftune_noise_alpha),
            lambda s: "`neftune_noise_alpha` (its noise is drawn per forward pass)", group="batched_clients"),
    Refusal(lambda s: batched(s) and bool(s.args.label_smoothing_factor),
            lambda s: "`label_smoothing_factor` (the per-client loss is the model's plain loss)",
            group="batched_clients"),
    Refusal(lambda s: batched(s) and s.compute_loss_func is not None,
            lambda s: "a `compute_loss_func` (the per-client loss is computed from the logits)",
            group="batched_clients"),
    Refusal(lambda s: batched(s) and bool(_overridden_loss(s)), _overridden_text, group="batched_clients"),
    # client-parallel: one message likewise
    Refusal(lambda s: s.args.client_parallel and batched(s),
            lambda s: f"`batched_clients={s.args.batched_clients}` (set it to 1: a batched chunk cannot be split "
                      "across processes)", group="client_parallel"),
    Refusal(lambda s: s.args.client_parallel and bool(federated_buffers(s.model)),
            lambda s: "a model with averaged buffers (BatchNorm statistics of a row shard are not the batch's)",
            group="client_parallel"),
    Refusal(lambda s: s.args.client_parallel and (s.compute_loss_func is not None or s.loss_is_scaled_for_ga),
            lambda s: "a `compute_loss_func` (each shard's loss must be the model's own mean to be weighted)",
            group="client_parallel"),
    # FSDP: what reads whole tensors or per-client copies that the round's shards cannot give
    Refusal(lambda s: sharded(s) and (PERSONAL in s.sharing_roles.values() or s.sharing.preset != "all"
                                       or s.args.lora_client_ranks is not None),
            lambda s: "a `parameter_sharing` other than 'all' or `lora_client_ranks` (personal and partly trained "
                      "tensors are kept per client whole)", group="fsdp"),
    Refusal(lambda s: sharded(s) and (s.rule.aggregator.gathers or s.needs_lora_pairs
                                       or s.rule.aggregator.folds_into_base or s.rule.aggregator.needs_preconditioners
                                       or s.rule.aggregator.freezes_lora_a or s.rule.aggregator.refactorises_lora),
            lambda s: f"`server_rule={s.rule.name!r}` (it reads whole tensors: every client's update, LoRA products "
                      "and their SVD, base weights or the clients' preconditioners to invert)", group="fsdp"),
    Refusal(lambda s: sharded(s) and getattr(s.algorithm.local_optimizer.cls, "needs_model", False),
            lambda s: f"`local_optimizer={s.algorithm.local_optimizer.cls.__name__}` (its curvature pass runs the "
                      "full batches through the model on every process, which FSDP would sum over processes)",
            group="fsdp"),
    Refusal(lambda s: sharded(s) and (parse_plan(s.args.uplink_compression).active
                                       or parse_plan(s.args.downlink_compression).active),
            lambda s: "`uplink_compression`/`downlink_compression` (top-k, low rank and quantiser scales read whole "
                      "tensors)", group="fsdp"),
    Refusal(lambda s: sharded(s) and (s.args.dp_mode != "off" or s.args.secure_aggregation),
            lambda s: "`dp_mode`/`secure_aggregation` (a client's clip and noise are drawn over its whole update)",
            group="fsdp"),
    Refusal(lambda s: sharded(s) and s.args.drift_spectral,
            lambda s: "`drift_spectral=True` (a spectral norm needs whole matrices)", group="fsdp"),
    Refusal(lambda s: sharded(s) and any(not p.is_floating_point() for p in s.model.parameters()),
            lambda s: "a quantised base (QLoRA: bitsandbytes' integer weights keep their quantisation state outside "
                      "the tensor, which FSDP2's DTensor conversion drops; accelerate leaves them unsharded, so "
                      "sharding would not divide the base's memory)", group="fsdp"),
]

# one setting's problems in one message: (head, fix)
GROUPS: Dict[str, tuple] = {
    "batched_clients": (lambda s: f"`batched_clients={s.args.batched_clients}` cannot train clients together with ",
                        "Set `batched_clients=1` or change that setting."),
    "client_parallel": (lambda s: "`client_parallel=True` cannot run with ",
                        "Turn client_parallel off or change that setting."),
    "fsdp": (lambda s: "`fsdp` (the model sharded over the processes) cannot run with ",
             "Change that setting, or run without FSDP (unset `fsdp`; launch without an FSDP config)."),
}
