"""``torch_compile``: the resident model compiled once, in place, for every client, round and evaluation.

Trainer compiles inside its own loop: accelerate wraps the model in ``torch.compile`` when it prepares it. The round
loop never prepares the resident model (a DDP wrapper would all-reduce every local backward), so fedhf compiles it
itself, once, with ``nn.Module.compile`` and the user's ``torch_compile_backend`` / ``torch_compile_mode``: the
model object stays the same (its parameter names, ``save_pretrained`` and the trainer's references are unchanged),
and its ``__call__`` runs the compiled forward.

Why nothing recompiles from client to client: every client loads its values into the same parameter tensors
(``load_into``), and dynamo treats a module's parameters as graph inputs, so new values reuse the compiled graph.
A batched chunk swaps the trainable linears for stacked ones (fedhf/runtime/stacked_adapters.py) of the same
class; their guards are on types and shapes, not on which objects they are. What does recompile (dynamo's guards,
with Trainer's ``dynamic=None``: static shapes first, symbolic ones after a size changes): a new input shape
(a new number of clients C in a chunk, a new row or labelled-position count), train against eval mode, and
gradients on against off. tests/runtime/test_compiled_model.py counts them.

accelerate would wrap the already compiled model in a second ``torch.compile`` in Trainer's evaluation loop, so
its dynamo plugin is switched off (:func:`without_accelerate_compile`).
"""

from __future__ import annotations

import torch


def compile_resident(model: torch.nn.Module, args) -> None:
    """Compile ``model`` in place when ``args.torch_compile`` (TrainingArguments set the backend, "inductor" by
    default). ``dynamic=None`` as Trainer passes it (static shapes until a size changes)."""
    if args.torch_compile:
        model.compile(backend=args.torch_compile_backend, mode=args.torch_compile_mode, dynamic=None)


def without_accelerate_compile(accelerator_args: dict) -> dict:
    """Trainer's accelerator arguments with accelerate's own compile off (the model is compiled once, in place)."""
    from accelerate.utils import TorchDynamoPlugin

    if "dynamo_plugin" in accelerator_args:
        accelerator_args["dynamo_plugin"] = TorchDynamoPlugin(backend="no")
    return accelerator_args
