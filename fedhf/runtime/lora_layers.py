"""The model's LoRA layers (base weight, A, B and the scale s = lora_alpha / r that peft applies), and the fold of a
server rule's residual into the frozen base weights.

A peft LoRA layer computes W x + s B A x (Hu et al. 2021, "LoRA", arXiv:2106.09685) with A (r x in) and
B (out x r), so its effective weight is W + s B A, the same (out x in) shape as an ``nn.Linear`` weight: no
transpose is needed except to write it into the (in x out) weight of a ``fan_in_fan_out`` layer (GPT-2's
Conv1D), which the rules that fold into the base refuse; the rules that only re-factorise B A accept it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch


@dataclass(frozen=True)
class LoraLayer:
    """One adapted linear layer: parameter names of its frozen base weight, A and B, and its scale s."""

    base: str
    a: str
    b: str
    scale: float


def lora_layers(model: torch.nn.Module, field: str = "server_rule",
                allow_fan_in_fan_out: bool = False) -> Dict[str, LoraLayer]:
    """The model's adapted linear layers, keyed by the name of A (``...lora_A.<adapter>.weight``).

    Refuses (naming ``field``) layer kinds whose effective weight is not W + s B A with A (r x in), B (out x r):
    DoRA (a magnitude vector rescales it), LoRA on embeddings, LoRA layers whose A and B are not ``nn.Linear``
    (peft's Conv1d/2d/3d LoRA: A is (r, in, k, ...), so B A is no weight), and unless ``allow_fan_in_fan_out``,
    ``fan_in_fan_out`` layers (GPT-2's Conv1D stores W as (in x out), so W += s B A would need a transpose; B A
    itself is (out x in) as for any layer, which is all a rule that never touches W uses)."""
    from peft.tuners.lora import LoraLayer as PeftLoraLayer

    names = {id(p): n for n, p in model.named_parameters()}
    layers: Dict[str, LoraLayer] = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, PeftLoraLayer):
            continue
        for adapter in module.lora_A:
            problem = _unsupported(module, adapter, allow_fan_in_fan_out)
            if problem:
                raise ValueError(f"`{field}` needs LoRA layers whose effective weight is W + (alpha/r) B A; "
                                 f"{module_name} uses {problem}. Use plain LoRA on linear layers.")
            a, b = module.lora_A[adapter].weight, module.lora_B[adapter].weight
            layers[names[id(a)]] = LoraLayer(base=names[id(module.get_base_layer().weight)], a=names[id(a)],
                                             b=names[id(b)], scale=float(module.scaling[adapter]))
        if len(module.lora_embedding_A):
            raise ValueError(f"`{field}` does not handle LoRA on embeddings ({module_name}); leave embeddings "
                             "out of target_modules.")
    return layers


def _unsupported(module, adapter: str, allow_fan_in_fan_out: bool) -> Optional[str]:
    if module.use_dora.get(adapter):
        return "DoRA (use_dora=True)"
    a, b = module.lora_A[adapter], module.lora_B[adapter]
    if not (isinstance(a, torch.nn.Linear) and isinstance(b, torch.nn.Linear)):
        return f"a {type(a).__name__} LoRA (A {tuple(a.weight.shape)}: not a linear layer's; leave conv layers out " \
               "of target_modules)"
    if getattr(module, "fan_in_fan_out", False) and not allow_fan_in_fan_out:
        return "fan_in_fan_out (a transposed base weight)"
    return None


class BaseFold:
    """The frozen base weights a server rule folds a residual into (FedEx-LoRA), for the trainer: their values
    at the start (kept in the run's state and checkpoint), the fold W += s R, and loading them into the model."""

    def __init__(self, model: torch.nn.Module, active: bool) -> None:
        # with load_best_model_at_end refused by the trainer (fedhf/trainer/config/combinations/): the best round's
        # adapter without that round's base weights is no model
        self.layers = lora_layers(model) if active else {}
        live = dict(model.named_parameters())
        self.targets = {layer.base: live[layer.base] for layer in self.layers.values()}
        if active:
            check_foldable(model, self.targets)

    def initial(self) -> Dict[str, torch.Tensor]:
        return {name: t.detach().to(torch.float32, copy=True) for name, t in self.targets.items()}

    def fold(self, base: Dict[str, torch.Tensor], residuals: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """W + s R for every adapted layer (R keyed by A's name, as the aggregator computes it)."""
        out = dict(base)
        for a, layer in self.layers.items():
            out[layer.base] = (base[layer.base].double() + layer.scale * residuals[a]).float()
        return out

    @torch.no_grad()
    def load(self, base: Dict[str, torch.Tensor]) -> None:
        for name, target in self.targets.items():
            target.copy_(base[name])


def check_foldable(model: torch.nn.Module, targets: Dict[str, torch.Tensor]) -> None:
    """Before any work: a rule that folds into the base writes W += s R into each adapted layer's base weight
    (and the saved model is the merged one, peft's ``merge_and_unload``), which needs a PeftModel whose base
    weights are plain floating-point tensors of their own."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        raise ValueError("`server_rule` folds into the base weights and saves the merged model, which needs a peft "
                         f"model (get_peft_model(model, LoraConfig(...))), got {type(model).__name__}.")
    for name, weight in targets.items():
        if not weight.is_floating_point():  # bitsandbytes 4-bit (packed uint8) or 8-bit (int8) storage
            raise ValueError(f"`server_rule` folds the LoRA product into the base weights, but {name} is quantised "
                             f"({weight.dtype}): load the base without quantization_config, or choose a rule that "
                             "never changes the base (server_rule='flexlora', 'fedsvd' or 'mean').")
    owners: Dict[int, list] = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        owners.setdefault(tensor.untyped_storage().data_ptr(), []).append(name)
    for target_name, weight in targets.items():
        others = [n for n in owners[weight.untyped_storage().data_ptr()] if n != target_name]
        if others:
            raise ValueError(f"`server_rule` folds the LoRA product into a base weight that is two parameters, "
                             f"{target_name} and {others[0]} (tied embeddings), so both would change: leave that "
                             "layer (e.g. lm_head) out of target_modules, or untie the weights first (load with "
                             "tie_word_embeddings=False).")
