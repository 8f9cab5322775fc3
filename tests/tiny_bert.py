"""A 1-layer BERT (hidden 16) with LoRA r=2 on synthetic tokens whose label is a function of the first token: a
federated run of a few rounds takes about a second on one CPU thread, for tests that check mechanics (what is
released, sampled, checkpointed), not learning."""

from __future__ import annotations

import datasets
import torch
from peft import LoraConfig, TaskType, get_peft_model
from transformers import BertConfig, BertForSequenceClassification

from fedhf import FederatedConfig, FederatedTrainer


def tiny_bert(seed: int = 0):
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, num_labels=2)
    lora = LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["query", "value"],
                      task_type=TaskType.SEQ_CLS)
    return get_peft_model(BertForSequenceClassification(cfg), lora)


def tiny_tokens(n: int = 128, seed: int = 0, length: int = 8) -> datasets.Dataset:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (n, length), generator=g)
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * length] * n,
                                       "label": (ids[:, 0] > 32).long().tolist()})


def tiny_config(tmp_path, name: str = "run", **overrides) -> FederatedConfig:
    base = dict(output_dir=str(tmp_path / name), report_to="none", disable_tqdm=True, logging_strategy="no",
                save_strategy="no", seed=0, num_clients=4, clients_per_round=4, num_rounds=2, local_steps=1,
                per_device_train_batch_size=8, use_cpu=True, eval_every_rounds=0, partition="iid",
                partition_report=False, algorithm="fedavg", learning_rate=0.5)
    base.update(overrides)
    return FederatedConfig(**base)


def tiny_trainer(tmp_path, name: str = "run", data=None, round_hooks=None, **overrides) -> FederatedTrainer:
    extra = {"round_hooks": round_hooks} if round_hooks else {}
    return FederatedTrainer(model=tiny_bert(), args=tiny_config(tmp_path, name, **overrides),
                            train_dataset=data if data is not None else tiny_tokens(), **extra)


def tiny_run(tmp_path, name: str = "run", data=None, round_hooks=None, resume=None, **overrides) -> FederatedTrainer:
    trainer = tiny_trainer(tmp_path, name, data, round_hooks, **overrides)
    trainer.train(resume_from_checkpoint=resume)
    return trainer
