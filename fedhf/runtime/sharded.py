"""One model over many processes: the resident model sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``)
under ``client_parallel``, for a model whose weights, gradients and optimizer state do not fit one device.

Asked for by ``fsdp=...`` / ``fsdp_config`` in the config or by ``accelerate launch --config_file <an FSDP config>``
(:func:`sharding_requested`). Every process trains every sampled client together (client_parallel: each
micro-batch split in row shards), and FSDP2 holds each parameter as a DTensor sharded on dim 0, rank p keeping rows
chunk p of ``torch.chunk`` (Zhao et al., 2023, "PyTorch FSDP", VLDB; torch's FSDP2 keeps that layout).

The federated round runs on the local shards, never on whole tensors:

* :meth:`ShardedModel.local_views` turns the plan's DTensor parameters into their local tensors, *views* of FSDP's
  sharded storage: loading the global model (``load_into``) writes the shards in place, reading a client's result
  (``snapshot``, ``difference``) reads them; the round's sums, the server rule (elementwise), the corrections and
  every per-client state (Theta, control variates, tracking terms) are this rank's rows of each tensor
  (compression, whose error-feedback residuals would be too, is refused: its scales and top-k read whole tensors);
* after each optimizer step's backward, FSDP has reduce-scattered the gradient (a sum over processes: the divide
  factor is 1, as client_parallel sums its shards' weighted losses) into DTensor ``.grad``; :meth:`take_gradients`
  hands each local gradient to its view, where clipping, the correction and an elementwise optimizer act;
* what needs a norm over the whole tensor (clipping, the faulty-update check, the drift metric, the byte counts) sums
  its partial squares over processes (:meth:`total`), one small all-reduce;
* what needs a whole matrix (Muon's Newton-Schulz, SOAP's eigenbases, a low-rank state sync's factorisation)
  gathers it, one matrix at a time (:mod:`fedhf.optim.whole_matrices`, :mod:`fedhf.sync.compressed` through
  ``ClientContext.layout``); anything else that reads whole tensors is refused before any work
  (fedhf/trainer/config/combinations/, group ``fsdp``).

The round's sums are therefore per shard and complete on each process: no all-reduce of the sums, only of the
scalars that add over shards (:meth:`ShardedModel.reduce_sums`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..core.context import WholeTensors
from ..core.params import TensorDict
from ..core.sums import RoundSums


def _flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes")


# An ``accelerate launch`` with an FSDP config passes it to the script as ``ACCELERATE_USE_FSDP=true`` and
# ``FSDP_*`` variables. They are read as the launch set them, when fedhf is imported: accelerate's Accelerator sets
# ``ACCELERATE_USE_FSDP`` itself once a config with ``fsdp`` has built one, which would turn FSDP on for every
# later config of the same process.
LAUNCH_ENVIRONMENT = {k: v for k, v in os.environ.items() if k == "ACCELERATE_USE_FSDP" or k.startswith("FSDP_")}


def sharding_requested(args) -> bool:
    """FSDP asked for: ``fsdp`` in the config (TrainingArguments turns any non-empty value into True), or an
    ``accelerate launch`` with an FSDP config (:data:`LAUNCH_ENVIRONMENT`)."""
    return bool(getattr(args, "fsdp", None)) or _flag(LAUNCH_ENVIRONMENT.get("ACCELERATE_USE_FSDP", "false"))


@dataclass(frozen=True)
class FSDPSettings:
    """What fedhf takes from an FSDP config: the FSDP units and whether a unit's weights are freed after its
    forward (FSDP2's ``reshard_after_forward``; False keeps them gathered until the backward, ZeRO-2 style)."""

    layer_classes: Tuple[str, ...] = ()
    reshard_after_forward: bool = True


#: The ``fsdp_config`` keys fedhf reads (Trainer strips a leading ``fsdp_``), and the keys TrainingArguments adds
#: itself, accepted at the value it gives them (it has no other: any other value asks for what fedhf does not do).
READ_KEYS = ("version", "transformer_layer_cls_to_wrap", "reshard_after_forward", "cpu_offload",
             "activation_checkpointing")
TRAINER_DEFAULTS = {"min_num_params": 0, "xla": False, "xla_fsdp_v2": False, "xla_fsdp_grad_ckpt": False,
                    "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}


def unread_keys(fsdp_config) -> List[str]:
    """The keys of ``fsdp_config`` that fedhf would not honour: neither read nor at Trainer's own default."""
    return sorted(k for k, v in (fsdp_config or {}).items()
                  if k not in READ_KEYS and not (k in TRAINER_DEFAULTS and v == TRAINER_DEFAULTS[k]))


def check_fsdp_launch(args) -> None:
    """``fsdp`` in a process that was not launched with others: refused with fedhf's fix before Trainer refuses it
    with its own ("Using fsdp only works in distributed training"). On CPUs Trainer counts a launch as distributed
    only with at least 2 processes; on GPUs a launcher's process of 1 is (world size 1 shards nothing, but runs)."""
    from .processes import has_distributed_accelerator, launched_processes

    launched = "WORLD_SIZE" in os.environ or (torch.distributed.is_available() and torch.distributed.is_initialized())
    if not args.fsdp or (launched and (launched_processes() >= 2 or has_distributed_accelerator())):
        return
    raise ValueError("`fsdp` shards the model over the processes of a launch, and this process was not launched with "
                     "others: run it with `torchrun --nproc_per_node N script.py` (N >= 2; on GPUs N >= 1) or "
                     "`accelerate launch --config_file <an FSDP config> script.py`, or unset `fsdp`.")


# ``accelerate launch`` FSDP settings that would change what is sharded, saved or loaded, and the values of them that
# fedhf's own behaviour matches (units from the decoder layers or the named classes, one consolidated save)
APPLIED_LAUNCH_VALUES = {
    "FSDP_AUTO_WRAP_POLICY": ("TRANSFORMER_BASED_WRAP",),
    "FSDP_STATE_DICT_TYPE": ("FULL_STATE_DICT",),
}


def _refuse_unapplied_launch_values(env) -> None:
    """The accelerate config's values fedhf would otherwise replace without a word (a size-based or no wrap, a sharded
    state dict), refused with the value fedhf applies. (accelerate's sharding strategy is FSDP1's; FSDP2 reads
    ``fsdp_reshard_after_forward``, which fedhf applies.)"""
    unapplied = {k: env[k] for k, accepted in APPLIED_LAUNCH_VALUES.items() if k in env and env[k] not in accepted}
    if unapplied:
        fixes = ", ".join(f"{k.lower()}: {APPLIED_LAUNCH_VALUES[k][0]}" for k in unapplied)
        raise ValueError(f"The accelerate config's FSDP settings {unapplied} are not applied by fedhf (it shards the "
                         f"decoder layers, or the classes in fsdp_transformer_layer_cls_to_wrap, and saves one "
                         f"consolidated model): set {fixes} in the accelerate config, or remove them.")


def fsdp_settings(args) -> FSDPSettings:
    """The FSDP settings of a run, from ``fsdp``/``fsdp_config`` (TrainingArguments turns them into
    ``fsdp_plugin_args``) or else from an ``accelerate launch`` FSDP config (its ``FSDP_*`` environment); refuses,
    naming the fix, what the round loop cannot honour."""
    if getattr(args, "fsdp", None):
        unread = unread_keys(args.fsdp_config)
        if unread:
            raise ValueError(f"`fsdp_config` keys {unread} are not applied by fedhf, which reads only "
                             f"{list(READ_KEYS)} (FSDP2 units from the decoder layers, or the classes named in "
                             "`transformer_layer_cls_to_wrap`; the model saved whole by fedhf's own gather): "
                             "remove them.")
        plugin = dict(args.fsdp_plugin_args or {})
        version, offload = int(plugin.get("fsdp_version", 2)), bool(plugin.get("cpu_offload", False))
        checkpointing = bool(plugin.get("activation_checkpointing", False))
        classes, reshard = plugin.get("transformer_cls_names_to_wrap", ""), plugin.get("reshard_after_forward", True)
    else:
        env = LAUNCH_ENVIRONMENT
        _refuse_unapplied_launch_values(env)
        version, offload = int(env.get("FSDP_VERSION", "1")), _flag(env.get("FSDP_OFFLOAD_PARAMS", "false"))
        checkpointing = _flag(env.get("FSDP_ACTIVATION_CHECKPOINTING", "false"))
        classes, reshard = env.get("FSDP_TRANSFORMER_CLS_TO_WRAP", ""), env.get("FSDP_RESHARD_AFTER_FORWARD", "true")
    where = "`fsdp_config`" if getattr(args, "fsdp", None) else "the accelerate config's fsdp_config"
    if version != 2:
        raise ValueError(f"FSDP version {version} is not supported: fedhf shards the resident model with FSDP2 "
                         f"(`fully_shard`); set `version: 2` in {where} (accelerate: `fsdp_version: 2`).")
    if offload:
        raise ValueError(f"FSDP's CPU offload is not supported by the round loop (its shards are read and written "
                         f"between steps on the model's device): turn `cpu_offload`/`offload_params` off in {where}.")
    if checkpointing:
        raise ValueError(f"FSDP's `activation_checkpointing` in {where} is not applied by fedhf: turn it off and "
                         "set `activation_checkpointing=True` in the FederatedConfig instead.")
    names = tuple(n.strip() for n in (classes.split(",") if isinstance(classes, str) else classes) if n.strip())
    return FSDPSettings(names, _flag(reshard) if isinstance(reshard, str) else bool(reshard))


def chunk_rows(tensor: torch.Tensor, size: int) -> List[torch.Tensor]:
    """``torch.chunk`` on dim 0 padded with empty chunks to ``size`` (FSDP2's layout: rank p holds chunk p)."""
    chunks = list(torch.chunk(tensor, size, dim=0))
    empty = tensor.new_empty((0, *tensor.shape[1:]))
    return chunks + [empty] * (size - len(chunks))


def gather_rows(local: torch.Tensor) -> torch.Tensor:
    """Every process's rows of one tensor, concatenated in rank order (sizes may differ by process)."""
    dist = torch.distributed
    size = dist.get_world_size()
    rows = torch.tensor([local.shape[0]], dtype=torch.long, device=local.device)
    counts = [torch.zeros_like(rows) for _ in range(size)]
    dist.all_gather(counts, rows)
    counts = [int(c) for c in counts]
    padded = local.new_zeros((max(counts), *local.shape[1:]))
    padded[:local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([part[:n] for part, n in zip(parts, counts)])


def decoder_layer_classes(model: torch.nn.Module) -> set:
    """The model's own ``_no_split_modules`` (the decoder layers of a transformers model; of the base under peft)."""
    base = getattr(model, "get_base_model", lambda: model)()
    return set(getattr(base, "_no_split_modules", None) or [])


def transformer_layers(model: torch.nn.Module, class_names: Optional[Sequence[str]]) -> List[torch.nn.Module]:
    """The modules sharded as their own FSDP units: those whose class is named in ``class_names`` (the FSDP
    config's ``transformer_layer_cls_to_wrap``), by default the model's own ``_no_split_modules`` (the decoder
    layers of a transformers model, as accelerate's TRANSFORMER_BASED_WRAP picks them). A named class that no module
    has is refused (as accelerate does): the root would be the only unit, gathered whole for every forward, and the
    memory FSDP was asked to divide would not be divided."""
    names = set(class_names or []) or decoder_layer_classes(model)
    missing = sorted(set(class_names or []) - {type(m).__name__ for m in model.modules()})
    if missing:
        raise ValueError(f"`transformer_layer_cls_to_wrap` names {missing}, and the model has no module of that class: "
                         f"name its layer class (this model's: {sorted(decoder_layer_classes(model))}), or leave it "
                         "unset for the model's decoder layers.")
    return [m for m in model.modules() if type(m).__name__ in names]


class ShardedModel:
    """The resident model under FSDP2, with the round's view of it (see the module docstring)."""

    active = True

    def __init__(self, model: torch.nn.Module, layer_classes: Optional[Sequence[str]] = None,
                 reshard_after_forward: bool = True) -> None:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        dist = torch.distributed
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        for layer in transformer_layers(model, layer_classes):
            fully_shard(layer, reshard_after_forward=reshard_after_forward)
        fully_shard(model, reshard_after_forward=reshard_after_forward)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # a sum over processes, as client_parallel's weighted shard losses need (gloo has no PREMUL_SUM)
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        self.model = model
        self.dtensors: Dict[str, torch.nn.Parameter] = dict(model.named_parameters())
        self.views: Dict[str, torch.Tensor] = {}

    # ---------------------------------------------------------------- the local shards
    def local_views(self, params: Dict[str, torch.nn.Parameter]) -> Dict[str, torch.Tensor]:
        """Each DTensor parameter's local rows, a view of FSDP's sharded storage (an in-place write is the
        parameter's); remembered so that :meth:`take_gradients` finds them."""
        with torch.no_grad():  # leaves sharing the storage; trainable like their parameter (rules read it)
            views = {name: p.to_local().requires_grad_(p.requires_grad) for name, p in params.items()}
        for name, view in views.items():
            expected = chunk_rows(torch.empty(self.dtensors[name].shape, device="meta"), self.size)[self.rank].shape
            if view.shape != expected:  # the layout gather_rows and local_part assume
                raise RuntimeError(f"FSDP shard of {name} has shape {tuple(view.shape)}, expected {tuple(expected)}.")
        self.views.update(views)
        return views

    def take_gradients(self, views: Dict[str, torch.Tensor]) -> None:
        """FSDP's reduce-scattered gradients (summed over processes) onto the views; the DTensor's ``.grad`` is
        cleared, so the next step's backward starts from none (as ``zero_grad(set_to_none=True)``)."""
        for name, view in views.items():
            p = self.dtensors[name]
            view.grad = None if p.grad is None else p.grad.to_local()
            p.grad = None

    def step_gradients(self, params: Dict[str, torch.Tensor], loss: float) -> float:
        """After a local step's backward: the gradients onto the views, and the step's loss summed over the
        processes' row shards (client_parallel's reduction, fedhf/trainer/runners/client_parallel.py)."""
        self.take_gradients(params)
        return float(self.total(torch.tensor(float(loss))))

    def full_state_dict(self) -> TensorDict:
        """The whole model's state dict on process 0 (``{}`` elsewhere), on the CPU: every process must call it
        (``torch.distributed.checkpoint``'s ``get_model_state_dict``, one parameter at a time)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def local_part(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a whole tensor (FSDP's layout)."""
        return chunk_rows(full, self.size)[self.rank]

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """The whole tensor from every rank's rows (one all-gather: one matrix at a time)."""
        return gather_rows(local)

    # ---------------------------------------------------------------- sums over shards
    def total(self, partial: torch.Tensor) -> torch.Tensor:
        """A sum over shards (a squared norm, a count of bytes): this rank's part summed over processes."""
        value = torch.as_tensor(partial, dtype=torch.float64).clone()
        torch.distributed.all_reduce(value)
        return value

    def clip_grad_norm_(self, tensors: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` with the norm of the whole gradient (every shard's squares summed)."""
        grads = [t.grad for t in tensors if t.grad is not None]
        squared = sum((g.double().pow(2).sum() for g in grads), torch.zeros((), dtype=torch.float64))
        norm = self.total(squared).sqrt()
        coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coefficient.to(g.dtype))
        return norm

    def reduce_sums(self, sums: RoundSums) -> None:
        """The round's only communication under FSDP: every process holds its own rows of every summed tensor and
        the same per-client scalars (weights, losses), so only what adds over shards is summed over processes:
        the bytes sent, and the drift metric's squared norms (``drift.theta_sq``; ``drift.theta`` becomes a
        one-entry tensor of the same squared norm, which is all :func:`fedhf.metrics.drift.drift` reads of it)."""
        keys = sorted(k for k in sums.keys() if k in ("uplink_bytes", "downlink_bytes")
                      or k.startswith("drift.theta_sq."))
        mean_keys = sorted(k for k in sums.keys() if k.startswith("drift.theta."))
        partial = [sums.get(k).reshape(()) for k in keys] + [sums.get(k).pow(2).sum() for k in mean_keys]
        if not partial:
            return
        totals = self.total(torch.stack(partial)).tolist()
        for key, value in zip(keys, totals):
            sums.set(key, value)
        for key, value in zip(mean_keys, totals[len(keys):]):
            sums.set(key, torch.tensor([value], dtype=torch.float64).sqrt())


class ShardedGathering:
    """The round's communication under FSDP (:meth:`ShardedModel.reduce_sums`), in place of the all-reduce of the
    sums (fedhf/server/server_needs.py's gatherings have the same two methods)."""

    keeps_updates = False

    def __init__(self, sharded: ShardedModel) -> None:
        self.sharded = sharded

    def keep(self, sums: RoundSums, client_id: int, delta: TensorDict) -> None:
        pass

    def all_reduce(self, sums: RoundSums, device: Optional[torch.device]) -> None:
        self.sharded.reduce_sums(sums)


class NotSharded(WholeTensors):
    """The same questions asked of a model that is not sharded: whole tensors, nothing to sum over processes."""

    active = False

    @staticmethod
    def total(partial: torch.Tensor) -> torch.Tensor:
        return partial

    @staticmethod
    def clip_grad_norm_(tensors: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(tensors, max_norm)


def shard_resident_model(model: torch.nn.Module, args, world) -> "ShardedModel | NotSharded":
    """FSDP2 over the resident model when the run asks for it (:func:`sharding_requested`), else
    :class:`NotSharded`. Needs the processes' group, which ``torchrun`` / ``accelerate launch`` set up."""
    if not sharding_requested(args):
        return NotSharded()
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("`fsdp` shards the model over the processes of a launch, and this process was not "
                         "launched with others: run it with `torchrun --nproc_per_node N script.py` or "
                         "`accelerate launch --config_file <an FSDP config> script.py` (N >= 2; on GPUs N >= 1), or "
                         "unset `fsdp`.")
    settings = fsdp_settings(args)
    return ShardedModel(model, settings.layer_classes, settings.reshard_after_forward)
