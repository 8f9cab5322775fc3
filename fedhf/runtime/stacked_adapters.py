"""Several clients in one forward/backward over the resident base: stacked adapters, rows routed per client.

A federated LoRA client trains a few MB of adapter on top of a frozen base of GBs; run one client at a time and
the accelerator mostly waits. With ``batched_clients = C`` the trainer trains C of a round's clients at once:
every trainable ``nn.Linear`` (LoRA's A and B, a classification head) is replaced for the chunk by a
:class:`RoutedLinear` holding C copies (the equivalent of stacked A[C, r, in], B[C, out, r]); the C clients'
batches are concatenated (client-major rows, padded on the right to one length) and go through the frozen base
once, and row block c goes through copy c. The loss is the sum over clients of each client's own mean (tokens after the
causal shift, or rows), so the gradient of copy c is exactly client c's gradient: the other clients' rows do
not touch it. Each client keeps its own optimizer, correction and state sync on its own copy; an optimizer that
runs the model itself (Sophia's curvature probe) does so with every row routed through its client's copy.

Prior art for one base and many adapters in one pass: S-LoRA / Punica (inference), mLoRA/ASPEN (Ye et al.,
2023, arXiv:2312.02515) and LoRAFusion (independent fine-tuning jobs); here the jobs are federated clients.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Sequence, Tuple

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
PAD_VALUES = {"labels": IGNORE_INDEX, "attention_mask": 0}  # input_ids: the model's pad id; any other column: 0


@dataclass
class Routing:
    """Which rows of the concatenated batch belong to which copy: copy c owns rows ``segments[c]``."""
    segments: List[Tuple[int, int]] = field(default_factory=list)

    def only(self, client: int, copies: int, rows: int) -> None:
        """Send every row of a ``rows``-row batch through copy ``client`` (a client's own curvature pass)."""
        self.segments = [(0, 0)] * client + [(0, rows)] + [(rows, rows)] * (copies - client - 1)


class RoutedLinear(torch.nn.Module):
    """C copies of a ``nn.Linear``, one per client; row block c of the input goes through copy c. Each copy is an
    ordinary ``nn.Linear`` whose parameters are that client's own leaves of the graph, so a backward puts each
    client's gradient on its own parameters and anything that differentiates a client's loss with respect to
    its parameters (Sophia's curvature probe) works unchanged."""

    def __init__(self, linear: torch.nn.Linear, copies: int, routing: Routing) -> None:
        super().__init__()
        self.copies = torch.nn.ModuleList(copy.deepcopy(linear) for _ in range(copies))
        self.routing = routing

    @property
    def weight(self) -> torch.Tensor:  # peft casts its input to ``lora_A.weight.dtype``
        return self.copies[0].weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.copies[c](x[start:stop]) for c, (start, stop) in enumerate(self.routing.segments)])


def trainable_linears(model: torch.nn.Module) -> Dict[str, torch.nn.Linear]:
    """The modules that hold the trainable parameters, by name; every trainable parameter must be the weight or
    bias of a plain ``nn.Linear`` whose parameters are all trainable (LoRA A/B, linear heads)."""
    owners: Dict[str, torch.nn.Module] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            module_name = name.rpartition(".")[0]
            owners[module_name] = model.get_submodule(module_name)
    bad = sorted(n for n, m in owners.items()
                 if type(m) is not torch.nn.Linear or not all(p.requires_grad for p in m.parameters()))
    if bad:
        raise ValueError(f"`batched_clients` stacks trainable nn.Linear layers (LoRA A/B, linear heads); these "
                         f"trainable modules are not: {bad[:4]}. Use LoRA on linear layers (no embedding/conv "
                         "adapters) or `batched_clients=1`.")
    return owners


Views = List[Dict[str, torch.nn.Parameter]]


@contextlib.contextmanager
def stacked_clients(model: torch.nn.Module, copies: int) -> Iterator[Tuple[Routing, Views]]:
    """Swap every trainable linear for a :class:`RoutedLinear` of ``copies`` copies (each starting from the
    module's current values) for the duration of the block. Yields the routing and, per copy, its parameters
    under the model's own names (what the client's optimizer, correction and messages use). The original
    modules come back afterwards."""
    routing = Routing()
    originals = trainable_linears(model)
    routed = {name: RoutedLinear(linear, copies, routing) for name, linear in originals.items()}
    for name, module in routed.items():
        _replace(model, name, module)
    try:
        views: Views = [{f"{name}.{pname}": p for name, module in routed.items()
                          for pname, p in module.copies[c].named_parameters()} for c in range(copies)]
        yield routing, views
    finally:
        for name, module in originals.items():
            _replace(model, name, module)


def _replace(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def model_pad_id(model: torch.nn.Module) -> int:
    """The token id the model itself treats as padding (``config.pad_token_id``), or 0 for a model that declares
    none (then no id is special to it, so any value under a 0 attention mask is invisible).

    Why the model's id and not the collator's: a decoder sequence classifier pools the rightmost token that is not
    ``pad_token_id`` (and RoBERTa-style position ids skip it), so only positions holding the model's pad id are
    invisible to it. Padding a row on the right with that id leaves exactly what the model saw when the client
    was trained alone, whatever the collator itself padded with."""
    config = getattr(model, "config", None)  # a plain nn.Module has no config, and so no pad id of its own
    pad = config.get_text_config().pad_token_id if config is not None else None
    return 0 if pad is None else int(pad)


def concat_batches(batches: Sequence[Mapping[str, torch.Tensor]],
                   pad_id: int = 0) -> Tuple[Dict[str, torch.Tensor], Routing]:
    """One batch of the clients' batches, client-major; columns of different lengths padded on the right
    (``input_ids`` with ``pad_id``, the model's pad token (:func:`model_pad_id`), labels with -100, the attention
    mask and any other column with 0), which needs an attention mask, or packed rows' ``position_ids``: a padding
    token at position 0 starts a document of its own, attends only to itself and carries no label."""
    keys = list(batches[0])
    if any(list(b) != keys for b in batches):
        raise ValueError("batched clients need batches with the same columns.")
    out = {}
    for key in keys:
        tensors = [b[key] for b in batches]
        if not torch.is_tensor(tensors[0]):
            # a forward flag (the packing collator's use_cache=False) holds for the whole pass if every client agrees
            if any(t != tensors[0] for t in tensors[1:]):
                raise ValueError(f"batched clients need one value of the non-tensor column `{key}` for every client "
                                 f"(got {tensors}); use batched_clients=1.")
            out[key] = tensors[0]
            continue
        length = max(t.shape[1] for t in tensors) if tensors[0].ndim >= 2 else None
        if length is not None and any(t.shape[1] != length for t in tensors):
            if "attention_mask" not in keys and "position_ids" not in keys:
                raise ValueError("batched clients pad rows to one length, which needs an `attention_mask` column "
                                 "(or packed rows' per-document `position_ids`).")
            fill = pad_id if key == "input_ids" else PAD_VALUES.get(key, 0)
            tensors = [F.pad(t, (0, 0) * (t.ndim - 2) + (0, length - t.shape[1]), value=fill) for t in tensors]
        out[key] = torch.cat(tensors)
    starts = [0]
    for b in batches:
        starts.append(starts[-1] + len(b[keys[0]]))
    return out, Routing(list(zip(starts[:-1], starts[1:])))


def row_losses(logits: torch.Tensor, labels: torch.Tensor, shifted: bool) -> torch.Tensor:
    """Per row, the loss summed over its items (label tokens != -100, or the row itself), as the model's own loss
    computes it before its mean: cross-entropy in fp32 (after the causal shift when ``shifted``), or the squared
    error of a one-output regression head."""
    if labels.ndim >= 2:  # per-token labels (causal LM: predict token t+1 from position t)
        if shifted:
            logits, labels = logits[:, :-1], labels[:, 1:]
        loss = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="none")
        return loss.view(labels.shape).flatten(1).sum(1)
    if logits.shape[-1] == 1 and labels.is_floating_point():  # regression head
        return F.mse_loss(logits.float().squeeze(-1), labels.float(), reduction="none")
    if labels.is_floating_point():
        raise ValueError("batched clients support single-label classification, regression and per-token labels; "
                         "for multi-label (float) labels use `batched_clients=1`.")
    return F.cross_entropy(logits.float(), labels, reduction="none")


def per_client(values: torch.Tensor, routing: Routing) -> torch.Tensor:
    """Sum of ``values`` over each client's rows: shape (C,)."""
    return torch.stack([values[start:stop].sum() for start, stop in routing.segments])
