"""The memory plan: what a run holds at once, printed at the start of ``train()`` (in full at ``log_level`` info or
debug, or when ``memory_budget_gb`` is set; otherwise as one line with its largest rows) and checked against
``memory_budget_gb`` before any training or file write.

Rows (bytes; C = ``batched_clients``, the clients trained at once):

* model -- every parameter and buffer of the resident model, by dtype, each storage once; quantised bitsandbytes
  weights at their stored (packed uint8 / int8) size plus their quantisation constants.
* adapter copies -- the trainable tensors x C when C > 1 (each batched client trains its own copy beside the model's).
* gradients -- the trainable tensors x C (a gradient has its parameter's dtype).
* optimizer state -- one client's state as its local optimizer declares it (``LocalOptimizer.state_bytes``) x C.
* run state -- what the server carries between rounds (x^r and buffers in fp32, server-rule state, the correction's
  broadcast state, Thetabar, the initial personal tensors, a folded base): measured on the run's own tensors.
* client store -- per client: its correction state (SCAFFOLD c_i, tracking y_i), a kept Theta (at most the
  optimizer state), its personal tensors (fp32) and, with uplink compression and ``error_feedback``, the float64
  residual of every model-change tensor the plan compresses (fedhf/trainer/hooks/compression.py; the residuals of
  compressed buffers and state messages and PowerSGD's per-client Q are not counted, a note says so),
  x the clients that can take part (``num_clients``; under fixed-size sampling at most the trainings the round
  policy starts in ``num_rounds``, since a client's state is stored when it first trains, unless a user's round hook
  resizes the sample or may add clients to it); capped by ``client_state_budget_mb``
  (fedhf/core/client_store.py spills the rest to disk; benchmarks/memory.py measures that cap at 10,000 clients).
* round sums -- the round's running sums of the client messages, kept in float64 (fedhf/core/sums.py): the
  update of every shared tensor and averaged buffer, the correction's message (the change of its per-client state,
  counted at that state's size), the optimizer's Theta for the drift metric and, when the state-sync rule averages
  it, once more (each counted at the whole optimizer state), and for the LoRA
  product rules (FedEx-LoRA, FLoRA, FlexLoRA) the dense (out x in) product B A of every adapted layer.
* client products -- those rules' one client's dense products in fp32 while its message is formed.
* gathered updates -- robust rules that gather (median, trimmed mean, Krum...) keep every participant's update:
  ``clients_per_round`` x the fp32 trainable tensors (under Poisson sampling a cohort size exceeded with probability
  1e-6 over the run; ``num_clients`` under a round hook that resizes the sample or adds clients to it).
* best round -- with ``load_best_model_at_end``, the fp32 copy of the best round's global model (shared tensors,
  averaged buffers and the global personal part) kept until the end.
* merged copy at save -- rules that fold into the base (FedEx-LoRA, FLoRA) save the full model with the adapter
  merged, built on a copy of the model (fedhf/trainer/hooks/outputs.py): one more model while a checkpoint is written.
* activations -- the estimate below, x C (the C clients' micro-batches go through the model together).
* autocast copies -- under bf16/fp16 autocast of a wider model, the half-precision weight copies the forward keeps.
* logits -- a causal LM's head, usually its largest activation (Gemma-3-270M: V = 262,144 per position, more
  than its 18 layers keep together), x C, the largest of:

  - the loss over materialised logits: 3 fp32 logits-sized tensors (V x 4 bytes per position; the loss upcasts
    the logits to fp32 and autograd keeps that copy, then the log-softmax's and the logits' gradients), at the
    labelled positions with ``logits_at_labels_only`` (fedhf/runtime/labelled_logits.py; those of the
    ``per_device_train_batch_size`` rows with the most labels), else at every position of the largest batch;
  - trl's fused LM head (FederatedSFTTrainer, trl >= 1.16), which never materialises the logits: its backward
    holds 8 fp32 tiles of at most 4,096 positions x 32,768 tokens (every position on CPU, the labelled ones where
    trl runs Triton), an fp32 copy of a 32,768-row slice of the head's weight and the hidden states' gradient;
  - a local optimizer's curvature pass through ``ModelAccess.logits`` (``logits_pass``), which projects every
    position: differentiated (Sophia's GNB estimator), 2 logits-sized tensors in the head's dtype (the logits and
    the copy without each row's last position; their gradients in the backward), then 4 fp32 ones at the
    labelled positions; a forward only (FOOF's statistics, FedPM), 1 logits-sized tensor, less the activations
    (a no-grad forward keeps none).

  The constants were measured as the peak of the tensors a run allocates (``fedhf.runtime.model_memory.peak_tensor_bytes``, torch's
  profiler) on the tiny Llama of tests/trainer/runners/test_memory_plan.py (V = 30,522, fp32, where the head is most of
  the step): 3.0 logits-sized tensors with every position projected, also per client with 2 batched clients
  (3.9 before the stacked modules were reused across chunks), 2.0 (+ the labelled rows) in the GNB
  pass, 1.0 in FOOF's, 7.8 tiles in trl's head; and against the peak resident set of Gemma-3-270M LoRA runs in
  bf16 and fp32 (benchmarks/memory_plan.py --gemma). The resident set also holds what libraries allocate outside torch's
  tensors (library buffers, the allocator's slack), which the plan does not count (a note says so): with the small
  fp32 Llama of benchmarks/memory_plan.py (30,522-token head, every position labelled) a fresh process's peak
  resident set was 1.4-1.6x the plan while its tensors' peak was 0.97-1.00x; with Gemma-3-270M 0.93-1.07x.
  The largest batch is the one that holds the longest row: the collators pad a batch to its own longest row.
  Not counted, and said in the plan's notes (``unplanned_memory`` of the local optimizer): Sophia's Hutchinson
  estimator, whose second backward goes through the gradient's graph; FOOF's float64 Cholesky factors and a
  preconditioned server's float64 solves (FedPM on Gemma-3-270M peaked 1.33x the plan).

Activations (what the forward keeps for the backward), in elements per token of a micro-batch of T tokens
(``per_device_train_batch_size`` x the longest ``input_ids`` row), for a transformer with L layers, hidden h,
MLP width i and (causal LMs) vocabulary V (the V per logit position is the row "logits")::

    no checkpointing:        L (8 h + 4 i) + V + h
    gradient checkpointing:  L h + (8 h + 4 i) + V + h      (layer inputs kept, one layer recomputed at a time)

times the model's parameter size (3 bytes for a bf16/fp16 base: its norms and the residual stream's upcasts keep
fp32 copies; Gemma-3-270M with a bf16 base kept 1.31x the 2-byte count, so 3 bytes is an upper bound by 15 %),
also under bf16/fp16 autocast of an fp32 model: autograd then keeps half-precision copies of the
matmuls' inputs beside fp32 norms, residuals and the loss's fp32 log-softmax of the logits, and on top of them
(row "autocast copies", once per forward) the half-precision copy of every frozen linear weight the forward
multiplies with. Measured on fp32 tiny Llamas with LoRA under CPU bf16 autocast (5 shapes, 96-192 tokens), what
autograd keeps is 0.80-0.91 of these two rows (fp32: 0.91-1.01 of the activation row); 2 bytes per element with no
copies, the earlier assumption, planned up to 2.2x too little. The constants 8 and 4 were measured on
LlamaForCausalLM + LoRA (all linear layers, sdpa attention) in fp32 on CPU as the bytes of every tensor autograd
saves for the backward (``torch.autograd.graph.saved_tensors_hooks``, parameters excluded): L (8.0 h + 4.0 i) +
1.0 V + 1.0 h per token (+ 7 r for LoRA's rank-r outputs, left out), the same for T = 256 and 512 tokens, h = 256
and 512, i = 2h and 4h, L = 4 and 8; with checkpointing L x 1.0 h. Eager attention adds its probabilities
(2 x heads x sequence per layer and token), not counted here. The peak also holds transient tensors (the
logits' gradient, a layer's recomputation); benchmarks/memory_plan.py compares the plan with a measured peak.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from peft import PeftModel
from transformers import PreTrainedModel

from ...compression import parse_plan
from ...core.params import num_bytes
from ...runtime.model_memory import activation_elements_per_token, autocast_copy_bytes, floating_size, model_bytes
from .client_bounds import round_participants, stored_clients
from ..hooks.compression import compressed_model_change
from ...runtime.head_memory import (HeadShape, cross_entropy_bytes, fused_head_bytes, logits_pass_bytes,
                          trl_scores_labelled_only)

GIB = 2**30


@dataclass
class MemoryPlan:
    """Bytes per row (see the module docstring). ``activation_bytes`` / ``optimizer_bytes_per_client`` are None
    when they cannot be estimated (the reason is in ``notes``)."""

    model_bytes: Dict[str, int]
    trainable_bytes: int
    clients_at_once: int
    optimizer_bytes_per_client: Optional[int]
    run_state_bytes: int
    client_store_bytes_per_client: int
    stored_clients: int
    client_store_cap_bytes: Optional[int] = None
    activation_bytes_per_client: Optional[int] = None
    logits_bytes_per_client: int = 0
    round_sums_bytes: int = 0
    product_bytes: int = 0
    gathered_bytes: int = 0
    autocast_copy_bytes: int = 0
    best_round_bytes: int = 0
    merged_copy_bytes: int = 0
    notes: list = field(default_factory=list)

    @property
    def adapter_copy_bytes(self) -> int:
        return self.trainable_bytes * self.clients_at_once if self.clients_at_once > 1 else 0

    @property
    def gradient_bytes(self) -> int:
        return self.trainable_bytes * self.clients_at_once

    @property
    def optimizer_bytes(self) -> int:
        return (self.optimizer_bytes_per_client or 0) * self.clients_at_once

    @property
    def client_store_bytes(self) -> int:
        total = self.client_store_bytes_per_client * self.stored_clients
        return total if self.client_store_cap_bytes is None else min(total, self.client_store_cap_bytes)

    @property
    def activation_bytes(self) -> int:
        return (self.activation_bytes_per_client or 0) * self.clients_at_once

    @property
    def logits_bytes(self) -> int:
        return self.logits_bytes_per_client * self.clients_at_once

    def rows(self) -> Dict[str, int]:
        return {"model": sum(self.model_bytes.values()), "adapter copies": self.adapter_copy_bytes,
                "gradients": self.gradient_bytes, "optimizer state": self.optimizer_bytes,
                "run state": self.run_state_bytes, "client store": self.client_store_bytes,
                "round sums": self.round_sums_bytes, "client products": self.product_bytes,
                "gathered updates": self.gathered_bytes, "best round": self.best_round_bytes,
                "merged copy at save": self.merged_copy_bytes,
                "activations": self.activation_bytes, "autocast copies": self.autocast_copy_bytes,
                "logits": self.logits_bytes}

    @property
    def total_bytes(self) -> int:
        return sum(self.rows().values())

    def __str__(self) -> str:
        detail = {
            "model": ", ".join(f"{d} {_mb(b)}" for d, b in sorted(self.model_bytes.items())),
            "adapter copies": f"{_mb(self.trainable_bytes)} x {self.clients_at_once}" if self.clients_at_once > 1
            else "none (one client at a time trains the model's own)",
            "gradients": f"{_mb(self.trainable_bytes)} x {self.clients_at_once}",
            "optimizer state": "not declared" if self.optimizer_bytes_per_client is None
            else f"{_mb(self.optimizer_bytes_per_client)} x {self.clients_at_once}",
            "run state": "x^r, server and correction state",
            "client store": f"{_mb(self.client_store_bytes_per_client)} x {self.stored_clients} clients"
            + (f", capped at {_mb(self.client_store_cap_bytes)}" if self.client_store_cap_bytes is not None else ""),
            "round sums": "float64 sums of the round's client messages",
            "client products": "a client's dense LoRA products B A (fp32)" if self.product_bytes else "none",
            "gathered updates": "every participant's update (fp32)" if self.gathered_bytes else "none",
            "best round": "the best round's global model (fp32)" if self.best_round_bytes else "none",
            "merged copy at save": "the model copy a merged save builds" if self.merged_copy_bytes else "none",
            "activations": "not estimated" if self.activation_bytes_per_client is None
            else f"{_mb(self.activation_bytes_per_client)} x {self.clients_at_once}",
            "autocast copies": "half-precision weight copies, once per forward" if self.autocast_copy_bytes
            else "none",
            "logits": f"{_mb(self.logits_bytes_per_client)} x {self.clients_at_once} (the head and its loss)",
        }
        lines = ["fedhf memory plan"] + [f"  {name:<20}{_mb(b):>12}  {detail[name]}" for name, b in self.rows().items()]
        lines.append(f"  {'total':<20}{_mb(self.total_bytes):>12}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


    def summary(self) -> str:
        """One line: the total and the three largest rows."""
        largest = sorted(((b, name) for name, b in self.rows().items() if b), reverse=True)[:3]
        return (f"fedhf memory plan: {_mb(self.total_bytes)} in total ("
                + ", ".join(f"{name} {_mb(b)}" for b, name in largest)
                + "); log_level='info' or memory_budget_gb prints every row")


def plan_text(plan: MemoryPlan, args) -> str:
    """What ``train()`` prints: every row when the user asked for detail (``log_level`` info or debug, e.g.
    ``TRANSFORMERS_VERBOSITY=info``) or set a budget the plan is checked against, else the one-line summary."""
    detailed = args.get_process_log_level() <= logging.INFO or args.memory_budget_gb is not None
    return str(plan) if detailed else plan.summary()


def _mb(nbytes: float) -> str:
    """Bytes in the unit that shows them (a LoRA adapter is KBs, a base model GBs)."""
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:,.1f} {unit}"
    return f"{int(nbytes)} B"


def check_budget(plan: MemoryPlan, args) -> None:
    """Refuse a plan over ``memory_budget_gb``, naming what would bring it down."""
    budget = args.memory_budget_gb
    if budget is None or plan.total_bytes <= budget * GIB:
        return
    rows = sorted(plan.rows().items(), key=lambda kv: -kv[1])
    fixes = []
    if plan.clients_at_once > 1:
        fixes.append(f"a smaller `batched_clients` (now {plan.clients_at_once}; each client adds its adapter copy, "
                     "gradient, optimizer state and activations)")
    if plan.activation_bytes and not args.activation_checkpointing:
        fixes.append("`gradient_checkpointing=True` (keeps one layer's activations instead of all)")
    if plan.activation_bytes:
        fixes.append(f"a smaller `per_device_train_batch_size` (now {args.per_device_train_batch_size}; with "
                     "`gradient_accumulation_steps` to keep the step's rows)")
    if plan.client_store_bytes and args.client_state_budget_mb is None:
        fixes.append("`client_state_budget_mb` (per-client state beyond it goes to disk)")
    if "uint8" not in plan.model_bytes and "int8" not in plan.model_bytes:
        fixes.append("a 4-bit base (from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True)))")
    raise ValueError(
        f"The memory plan needs {plan.total_bytes / GIB:.2f} GiB, over `memory_budget_gb`={budget:g} (largest: "
        + ", ".join(f"{name} {b / GIB:.2f} GiB" for name, b in rows[:3]) + "). Try " + "; or ".join(fixes)
        + ". Nothing was trained or written.\n" + str(plan))


def plan_memory(trainer, run) -> MemoryPlan:
    """This process's plan for ``trainer`` (a FederatedTrainer at the start of ``train()``) and its run state."""
    args, algo, model = trainer.args, trainer.algorithm, trainer.model
    trained = trainer.plan.trained()
    optimizer = algo.local_optimizer.state_bytes(trained)
    notes = ["not counted: memory outside torch's tensors (library buffers, the allocator's slack); on CPU the peak "
             "resident set was 1.4-1.6x the plan for a small fp32 Llama, 0.93-1.07x for Gemma-3-270M "
             "(benchmarks/memory_plan.py)"]
    if optimizer is None:
        notes.append(f"{algo.local_optimizer.cls.__name__} declares no state size (fedhf/optim/state_size.py): "
                     "its optimizer state is not counted")
    if algo.local_optimizer.unplanned_memory:
        notes.append(algo.local_optimizer.unplanned_memory)
    kept_theta = algo.state_sync.client_state_bytes(optimizer or 0)
    if kept_theta:
        notes.append("a kept Theta is counted at the optimizer's whole state (an upper bound)")
    personal = sum(t.numel() * 4 for t in trainer.plan.personal.values())  # kept as fp32 snapshots
    residuals = error_feedback_bytes(args, run.global_params)
    if residuals:
        notes.append("error feedback: the residuals of the model change are counted; those of compressed buffers "
                     "and state messages, and PowerSGD's per-client Q, are not")
    per_client = algo.correction.client_state_bytes(run.global_params) + kept_theta + personal + residuals
    activations, logits = _activation_bytes(trainer, notes)
    sums, products, gathered = _round_bytes(trainer, run, optimizer or 0)
    return MemoryPlan(
        model_bytes=model_bytes(model), trainable_bytes=num_bytes(trained), clients_at_once=args.batched_clients,
        optimizer_bytes_per_client=optimizer,
        run_state_bytes=sum(num_bytes(group) for group in run.tensor_groups().values()),
        client_store_bytes_per_client=per_client,
        stored_clients=stored_clients(trainer) if per_client else 0,
        client_store_cap_bytes=None if args.client_state_budget_mb is None
        else int(args.client_state_budget_mb * 2**20),
        activation_bytes_per_client=activations, logits_bytes_per_client=logits,
        round_sums_bytes=sums, product_bytes=products, gathered_bytes=gathered,
        autocast_copy_bytes=autocast_copy_bytes(model, args.bf16 or args.fp16),
        best_round_bytes=4 * sum(t.numel() for group in (run.global_params, run.global_buffers, trainer.plan.personal)
                                 for t in group.values()) if args.load_best_model_at_end else 0,
        merged_copy_bytes=sum(model_bytes(model).values()) if trainer.base_fold.layers else 0, notes=notes)


def error_feedback_bytes(args, shared) -> int:
    """One client's error-feedback residuals of its model change: float64, for each tensor the uplink plan
    compresses."""
    if not args.error_feedback:
        return 0
    compressed = compressed_model_change(parse_plan(args.uplink_compression), shared)
    return sum(8 * shared[name].numel() for name in compressed)


def _round_bytes(trainer, run, optimizer_bytes: int) -> Tuple[int, int, int]:
    """(round sums, one client's dense LoRA products, gathered updates): see the module docstring. The sums are
    float64, i.e. twice the fp32 size of what is summed."""
    from ...core.lora import lora_pairs
    from ...server.lora import ProductAggregator

    algo, shared = trainer.algorithm, run.global_params
    # the drift metric sums the clients' optimizer Theta, and a state-sync rule that averages it sums it once more:
    # each at most the whole optimizer state, which is what a plan can know before the optimizer exists
    theta_sums = 2 if algo.state_sync.averages_theta else 1
    summed = (num_bytes(shared) + num_bytes(run.global_buffers) + algo.correction.client_state_bytes(shared)
              + theta_sums * optimizer_bytes)
    products = 0
    if isinstance(algo.server_rule.aggregator, ProductAggregator):  # each client sends its dense B A
        products = sum(4 * shared[b].shape[0] * shared[a].shape[1] for a, b in lora_pairs(shared).items())
    gathered = round_participants(trainer) * num_bytes(shared) if trainer.gathering.keeps_updates else 0
    return 2 * (summed + products), products, gathered


def _activation_bytes(trainer, notes: list) -> Tuple[Optional[int], int]:
    """(activations, logits) of one client's micro-batch."""
    args, model, data = trainer.args, trainer.model, trainer.client_data.train_data
    lengths = _longest_row(data)
    if lengths is None:
        notes.append("activations not estimated: the training data has no `input_ids` column to read lengths from")
        return None, 0
    model = model.get_base_model() if isinstance(model, PeftModel) else model
    if not isinstance(model, PreTrainedModel):
        notes.append(f"activations not estimated: {type(model).__name__} is not a transformers model (no config)")
        return None, 0
    vocabulary = model.config.vocab_size if model.get_output_embeddings() is not None else 0
    elements = activation_elements_per_token(model.config, args.activation_checkpointing, 0)
    if elements is None:
        notes.append(f"activations not estimated: {type(model.config).__name__} has no hidden_size/num_hidden_layers")
        return None, 0
    size = floating_size(model)  # autocast does not shrink what is kept (module docstring)
    half_logits = size < 4 or args.bf16 or args.fp16  # the head's output dtype
    size = 3 if size < 4 else size  # a half-precision base keeps fp32 norms beside (module docstring)
    shards = trainer.world.size if trainer.world.client_parallel else 1  # a batch split over the processes
    rows = -(-args.per_device_train_batch_size // shards)
    labelled = _most_labels(data, rows)
    head = HeadShape(rows, lengths, labelled, vocabulary, model.config.hidden_size, half_logits)
    loss = (fused_head_bytes(head, trl_scores_labelled_only(args)) if trainer.fused_lm_head
            else cross_entropy_bytes(head, trainer.labelled_logits))
    activations = elements * size * rows * lengths
    kind = trainer.algorithm.local_optimizer.logits_pass
    curvature = 0 if kind is None else logits_pass_bytes(head, kind)
    if kind == "no_grad":  # a forward only: nothing kept for a backward, so the step's activations are not held
        curvature -= activations
    if trainer.fused_lm_head:
        notes.append("logits: trl's fused LM head, planned from its tile sizes (trl 1.16)")
    if curvature > loss:
        notes.append("logits: the local optimizer's curvature pass (every position's logits) is larger than the loss's")
    return activations, max(loss, curvature)


def _most_labels(data, rows: int) -> Optional[int]:
    """The labelled next-token positions (``labels`` != -100 after a row's first token) of the ``rows`` rows that
    have the most, read from the Arrow column; None without a per-token ``labels`` column (then every position
    counts)."""
    if "labels" not in data.column_names or not pa.types.is_list(data.data.column("labels").type):
        return None
    labels = _column(data, "labels").combine_chunks()
    starts, ends = labels.offsets.to_numpy()[:-1], labels.offsets.to_numpy()[1:]
    labelled = np.concatenate([[0], np.cumsum(labels.values.to_numpy(zero_copy_only=False) != -100)])
    per_row = labelled[ends] - labelled[np.minimum(starts + 1, ends)]
    return int(np.sort(per_row)[::-1][:rows].sum())


def _longest_row(data) -> Optional[int]:
    """The longest ``input_ids`` row of a datasets.Dataset (read from its Arrow column, without decoding rows)."""
    if not isinstance(data, datasets.Dataset) or "input_ids" not in data.column_names or len(data) == 0:
        return None
    return int(pc.max(pc.list_value_length(_column(data, "input_ids"))).as_py())


def _column(data: datasets.Dataset, name: str) -> pa.ChunkedArray:
    """A column of the dataset's rows: a ``select``/``shuffle`` keeps the whole table under an index mapping."""
    column = data.data.column(name)
    return column if data._indices is None else column.take(data._indices.column(0))


__all__ = ["MemoryPlan", "check_budget", "plan_memory"]
