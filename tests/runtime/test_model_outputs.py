"""Every model output Trainer accepts (ModelOutput, dict, tuple) works in the curvature passes of FOOF and Sophia."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from fedhf.runtime.model_outputs import logits_of

from tests.helpers import config, digit_trainer, trainable_state


class DictMLP(nn.Module):
    """A custom (non-transformers) model on 8x8 digits whose forward returns a plain dict, a tuple, or a
    ModelOutput, as Trainer allows."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))

    def forward(self, pixel_values, labels=None):
        logits = self.body(pixel_values)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        if self.kind == "dict":
            return {"logits": logits} if loss is None else {"loss": loss, "logits": logits}
        if self.kind == "tuple":
            return (logits,) if loss is None else (loss, logits)
        return SequenceClassifierOutput(loss=loss, logits=logits)


def test_logits_of_reads_every_output_shape():
    x = torch.randn(2, 3)
    assert logits_of({"logits": x}) is x
    assert logits_of((x,)) is x
    assert logits_of(SequenceClassifierOutput(logits=x)) is x
    with pytest.raises(ValueError, match="no 'logits'.*'hidden'"):
        logits_of({"hidden": x})


@pytest.mark.parametrize("kind", ["dict", "tuple", "model_output"])
@pytest.mark.parametrize("optimizer", ["foof", "sophia"])
def test_curvature_optimizers_train_a_model_returning_any_output(digits, tmp_path, kind, optimizer):
    model = DictMLP(kind)
    before = trainable_state(model)
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=1, local_steps=2, partition="iid",
                  local_optimizer=optimizer, learning_rate=0.01, max_excluded_rounds=0)
    trainer = digit_trainer(model, digits, args, evaluate=False)
    trainer.train()
    assert trainer.federated_history[-1]["participants"] == 2
    after = trainable_state(model)
    assert any(not torch.equal(before[n], after[n]) for n in before)
