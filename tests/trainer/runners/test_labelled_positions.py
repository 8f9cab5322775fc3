"""When FederatedTrainer cuts a causal LM's inputs to its labelled positions, and what a ``compute_loss`` override
gets in evaluation: every position's logits, as under Trainer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

from fedhf import FederatedTrainer
from fedhf.data.sft import SFTCollator

from tests.helpers import IdsOnly, answer_rows, config, tiny_llama_lora


class WeightedLoss:
    """A per-token weighted cross-entropy written the usual way: it reads ``(batch, length, vocab)`` logits."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits, target = outputs.logits[:, :-1, :], labels[:, 1:]
        weight = torch.linspace(0.5, 1.5, logits.shape[-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), weight=weight)
        return (loss, outputs) if return_outputs else loss


class WeightedFederated(WeightedLoss, FederatedTrainer):
    pass


class WeightedTrainer(WeightedLoss, Trainer):
    pass


def test_a_compute_loss_override_evaluates_as_under_trainer(tmp_path):
    """The override trains (it runs the model itself) and evaluates with the full logits: Trainer's eval_loss on the
    same model. Before, evaluation handed it one row of logits per labelled token and it raised IndexError."""
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=1, local_steps=1, partition="iid",
                  per_device_train_batch_size=4, per_device_eval_batch_size=8, learning_rate=0.05)
    fed = WeightedFederated(model=tiny_llama_lora(100), args=args, train_dataset=answer_rows(16),
                            data_collator=SFTCollator(IdsOnly()))
    assert fed.labelled_logits  # the cut stays on for what calls Trainer's own loss
    fed.train()
    held_out = answer_rows(16, seed=1)
    plain = WeightedTrainer(model=fed.model, args=TrainingArguments(str(tmp_path / "plain"), report_to="none",
                                                                    use_cpu=True, per_device_eval_batch_size=8),
                            eval_dataset=held_out, data_collator=SFTCollator(IdsOnly()))
    expected = plain.evaluate()["eval_loss"]
    assert fed.evaluate(held_out)["eval_loss"] == expected
