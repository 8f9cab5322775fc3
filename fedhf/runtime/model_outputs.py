"""Reading a model's outputs: the logits of any output ``transformers.Trainer`` accepts (a ``ModelOutput``, a plain
dict, or a tuple), and what a batch's mean loss is over.

Trainer's ``compute_loss`` takes ``outputs["loss"]`` from a dict/ModelOutput and ``outputs[0]`` from a tuple; the
curvature passes (Sophia's Gauss-Newton-Bartlett probe, FOOF's input covariances) need the logits of a batch
whose labels were removed, so the same three shapes are read here.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def logits_of(outputs) -> torch.Tensor:
    """The logits of a forward pass without labels: ``outputs["logits"]`` for a ModelOutput or dict, the first
    element of a tuple/list (no loss is returned without labels), or the tensor itself."""
    if torch.is_tensor(outputs):
        return outputs
    if isinstance(outputs, Mapping):  # ModelOutput is an OrderedDict
        if "logits" not in outputs:
            raise ValueError(f"The model's output has no 'logits' (keys: {sorted(outputs.keys())}); the curvature "
                             "pass of Sophia (gnb) and FOOF needs them: return {'logits': ...} from forward().")
        return outputs["logits"]
    if isinstance(outputs, (tuple, list)) and outputs and torch.is_tensor(outputs[0]):
        return outputs[0]
    raise TypeError(f"Cannot read logits from a model output of type {type(outputs).__name__}: return a "
                    "ModelOutput, a dict with 'logits', or a tuple whose first element is the logits.")


def loss_items(batch: dict, shifted: bool) -> int:
    """What a batch's mean loss is over: its label tokens != -100 (after a causal LM's shift) when labels are per
    token, else its rows."""
    labels = batch.get("labels")
    if torch.is_tensor(labels) and labels.ndim >= 2:
        return int(labels[..., 1:].ne(-100).sum() if shifted else labels.ne(-100).sum())
    tensor = labels if torch.is_tensor(labels) else next(v for v in batch.values() if torch.is_tensor(v))
    return int(tensor.shape[0])
