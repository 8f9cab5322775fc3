"""Several clients in one forward/backward over the resident base: stacked adapters, rows routed per client.

A federated LoRA client trains a few MB of adapter on top of a frozen base of GBs; run one client at a time and
the accelerator mostly waits. With ``batched_clients = C`` the trainer trains C of a round's clients at once:
every trainable ``nn.Linear`` (LoRA's A and B, a classification head) is replaced for the chunk by a
:class:`StackedLinear` holding the C copies as one stacked weight (C, out, in); the C clients' batches are
concatenated (client-major rows, padded on the right to one length) and go through the frozen base once, and each
stacked linear runs row block c through copy c in one batched matmul, so the kernels of a fused step do not grow
with C. The loss is the sum over clients of each client's own mean (tokens after the causal shift, or rows), so
the gradient of copy c is exactly client c's gradient: the other clients' rows do not touch it. Each client keeps
its own optimizer, correction and state sync on its own copy (views of its slice of the stacked storage); an
optimizer that runs the model itself (Sophia's curvature probe) does so with every row routed through its
client's copy.

Prior art for one base and many adapters in one pass: S-LoRA / Punica (inference), mLoRA/ASPEN (Ye et al.,
2023, arXiv:2312.02515) and LoRAFusion (independent fine-tuning jobs); here the jobs are federated clients.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
PAD_VALUES = {"labels": IGNORE_INDEX, "attention_mask": 0}  # input_ids: the model's pad id; any other column: 0


class Routing:
    """Which rows of the concatenated batch belong to which copy: copy c owns rows ``segments[c]`` (client-major
    blocks). ``client`` set: every row goes through that one copy (a client's own curvature pass).

    The index tensors a stacked matmul needs (:meth:`blocks`) are built on the host from the segments, which the
    host already knows (it concatenated the batches), and cached per routing: the hot path never reads the device
    to learn a shape."""

    def __init__(self, segments: Sequence[Tuple[int, int]] = ()) -> None:
        self.route(segments)

    def route(self, segments: Sequence[Tuple[int, int]]) -> None:
        """Row block c of each following pass goes through copy c."""
        self.segments: List[Tuple[int, int]] = list(segments)
        self.client: Optional[int] = None
        self._blocks: Dict[torch.device, Blocks] = {}

    def only(self, client: int, copies: int, rows: int) -> None:
        """Send every row of a ``rows``-row batch through copy ``client`` (a client's own curvature pass)."""
        self.route([(0, 0)] * client + [(0, rows)] + [(rows, rows)] * (copies - client - 1))
        self.client = client

    def blocks(self, device: torch.device) -> "Blocks":
        """The padded block layout of the segments on ``device`` (cached)."""
        if device not in self._blocks:
            self._blocks[device] = Blocks.of(self.segments, device)
        return self._blocks[device]


@dataclass(frozen=True)
class Blocks:
    """Client-major rows as C equal blocks of ``rows`` rows. When the segments differ in length, ``gather`` (C x
    rows) picks each block's rows from the batch (a short block repeats its first row as padding, whose outputs
    are dropped) and ``scatter`` (one per real row) picks the real rows back out of the C x rows outputs; both are
    None when every client has the same number of rows. ``owner``: each row's client (for the per-client sums)."""
    rows: int
    gather: Optional[torch.Tensor]
    scatter: Optional[torch.Tensor]
    owner: torch.Tensor

    @staticmethod
    def of(segments: Sequence[Tuple[int, int]], device: torch.device) -> "Blocks":
        lengths = [stop - start for start, stop in segments]
        rows = max(lengths)
        owner = [c for c, n in enumerate(lengths) for _ in range(n)]
        if all(n == rows for n in lengths):
            return Blocks(rows, None, None, to_device(torch.tensor(owner), device))
        # padding: the block's first row, or row 0 for an empty block (a client without rows in this pass)
        gather = [start + j if j < stop - start else (start if stop > start else 0)
                  for start, stop in segments for j in range(rows)]
        scatter = [c * rows + j for c, n in enumerate(lengths) for j in range(n)]
        return Blocks(rows, *(to_device(torch.tensor(index), device) for index in (gather, scatter, owner)))


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without waiting for the device's queue (pinned, non-blocking on CUDA)."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


class StackedLinear(torch.nn.Module):
    """C copies of a ``nn.Linear``, one per client, stored as one stacked weight (C, out, in) and bias (C, out):
    row block c of the input goes through copy c in one batched matmul (:class:`BlockLinear`), so a fused step runs
    one kernel per linear whatever C (mLoRA's and LoRAFusion's batched adapters; here the jobs are clients).

    ``copies[c]`` is an ordinary ``nn.Linear`` whose parameters are views of slice c of the stacked storage: what
    the client's optimizer, correction, clipping and messages hold. An optimizer's in-place step on them writes
    the stacked weight the next pass reads. The shared pass differentiates the stacked tensors;
    :meth:`grads_to_copies` then hands each copy the view of its slice of the stacked gradient. A client's own
    pass (``routing.client`` set: Sophia's curvature probe, FOOF's statistics) runs its copy as a plain linear, so
    anything that differentiates with respect to the client's parameters, or hooks its module, works unchanged."""

    def __init__(self, linear: torch.nn.Linear, copies: int, routing: Routing) -> None:
        super().__init__()
        self.routing = routing
        self.stacked_weight = _stack(linear.weight, copies)
        self.stacked_bias = None if linear.bias is None else _stack(linear.bias, copies)
        self.copies = torch.nn.ModuleList(self._view(linear, c) for c in range(copies))

    def _view(self, linear: torch.nn.Linear, c: int) -> torch.nn.Linear:
        view = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        view.weight = torch.nn.Parameter(self.stacked_weight.detach()[c])
        if linear.bias is not None:
            view.bias = torch.nn.Parameter(self.stacked_bias.detach()[c])
        return view

    def reload(self, linear: torch.nn.Linear) -> None:
        """Every copy back to ``linear``'s current values, gradients cleared: the next chunk reuses this module
        (its storage, its views, and a compiled graph's guards on it) instead of building another."""
        with torch.no_grad():
            for stacked, value in ((self.stacked_weight, linear.weight), (self.stacked_bias, linear.bias)):
                if stacked is not None:
                    stacked.copy_(value.unsqueeze(0).expand_as(stacked))
                    stacked.grad = None
        for copy_ in self.copies:
            for p in copy_.parameters():
                p.grad = None

    @property
    def weight(self) -> torch.Tensor:  # peft casts its input to ``lora_A.weight.dtype``
        return self.copies[0].weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.routing.client is not None:
            return self.copies[self.routing.client](x)
        blocks = self.routing.blocks(x.device)
        copies = len(self.copies)
        rows = x if blocks.gather is None else x.index_select(0, blocks.gather)
        rows = rows.reshape(copies, -1, x.shape[-1])  # (C, block rows x positions, in)
        out = BlockLinear.apply(rows, self.stacked_weight, self.stacked_bias)
        out = out.reshape(copies * blocks.rows, *x.shape[1:-1], out.shape[-1])
        return out if blocks.scatter is None else out.index_select(0, blocks.scatter)

    def grads_to_copies(self) -> None:
        """Each copy's gradient: its slice of the stacked gradient (a view), which is then released from the
        stacked tensor (the next pass accumulates afresh, as each client's ``zero_grad`` expects)."""
        for name, stacked in (("weight", self.stacked_weight), ("bias", self.stacked_bias)):
            if stacked is None:
                continue
            grads = (None,) * len(self.copies) if stacked.grad is None else stacked.grad.unbind(0)
            stacked.grad = None
            for copy_, grad in zip(self.copies, grads):
                getattr(copy_, name).grad = grad


class BlockLinear(torch.autograd.Function):
    """``F.linear`` per client block in one batched matmul: x (C, N, in), weight (C, out, in), bias (C, out) or
    None -> (C, N, out). The backward is linear's, batched over clients with the same operands in the same order
    (grad weight = g^T x, grad input = g W, grad bias = g summed over rows): autograd's own backward of ``bmm``
    would form x^T g instead, whose rounding differs, and Muon's orthogonalisation turns a rounding difference
    in a weak gradient direction into a visible one (fedpac_muon then missed sequential training by more than
    2e-5). With the same products, a client's gradient matches the one it gets trained alone bit for bit in most
    shapes on CPU, else to the last bits where the batched kernel blocks differently. Under autocast the operands are cast as autocast casts
    ``F.linear``'s, and each gradient goes back in its tensor's own dtype."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else weight.dtype
        ctx.dtypes = x.dtype, weight.dtype, None if bias is None else bias.dtype
        x, weight = x.to(dtype), weight.to(dtype)
        ctx.save_for_backward(x, weight)
        with torch.autocast(kind, enabled=False):
            if bias is None:
                return torch.bmm(x, weight.transpose(1, 2))
            return torch.baddbmm(bias.to(dtype).unsqueeze(1), x, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        x_dtype, weight_dtype, bias_dtype = ctx.dtypes
        grad = grad.to(x.dtype)
        grad_x = torch.bmm(grad, weight).to(x_dtype) if ctx.needs_input_grad[0] else None
        grad_weight = torch.bmm(grad.transpose(1, 2), x).to(weight_dtype) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(1).to(bias_dtype) if bias_dtype is not None and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def _stack(value: torch.Tensor, copies: int) -> torch.Tensor:
    """``copies`` copies of ``value`` stacked on a new first axis: a fresh leaf that requires grad."""
    return value.detach().unsqueeze(0).repeat(copies, *([1] * value.ndim)).requires_grad_()


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


@dataclass
class StackedClients:
    """The clients of a chunk on the resident model: the routing of each pass, each client's parameters under the
    model's own names (views of the stacked storage), and the stacked linears."""
    routing: Routing
    views: Views
    linears: List[StackedLinear]

    def grads_to_clients(self) -> None:
        """After a shared backward: each client's parameters get their slices of the stacked gradients."""
        for linear in self.linears:
            linear.grads_to_copies()


@contextlib.contextmanager
def stacked_clients(model: torch.nn.Module, copies: int,
                    kept: Optional[Dict[int, Tuple[Routing, Dict[str, StackedLinear]]]] = None
                    ) -> Iterator[StackedClients]:
    """Swap every trainable linear for a :class:`StackedLinear` of ``copies`` copies (each starting from the
    module's current values) for the duration of the block. The original modules come back afterwards.
    ``kept``: the stacked modules of earlier blocks by number of copies, reused (reloaded) and filled in, so a
    round's chunks build them once (a runner keeps them: rebuilding took ~0.1 s per chunk on a small CPU model)."""
    originals = trainable_linears(model)
    if kept is not None and copies in kept and list(kept[copies][1]) == list(originals):
        routing, stacked = kept[copies]
        for name, module in stacked.items():
            module.reload(originals[name])
    else:
        routing = Routing()
        stacked = {name: StackedLinear(linear, copies, routing) for name, linear in originals.items()}
        if kept is not None:
            kept[copies] = routing, stacked
    for name, module in stacked.items():
        _replace(model, name, module)
    try:
        views: Views = [{f"{name}.{pname}": p for name, module in stacked.items()
                          for pname, p in module.copies[c].named_parameters()} for c in range(copies)]
        yield StackedClients(routing, views, list(stacked.values()))
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
    """Sum of ``values`` over each client's rows: shape (C,), one index_add whatever C."""
    owner = routing.blocks(values.device).owner
    return values.new_zeros(len(routing.segments)).index_add(0, owner, values)
