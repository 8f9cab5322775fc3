"""The tiny reference run every feature changes: a 1-layer Llama (hidden 32, untied head, vocabulary 32) with LoRA
r=4 on q_proj and v_proj, synthetic token rows of 4-16 tokens padded per batch, 4 clients of 8 rows, 3 sampled per
round, 2 rounds of 2 local steps at batch 4. A run takes a fraction of a second on one CPU thread.

``run(spec)`` trains one configuration (a dict of features' settings merged, see :func:`merge`) and returns its
:class:`Outcome`: the trainable tensors, the round history and, when asked, the LoRA dropout masks of every training
forward. It runs in this process, or in each process of a torchrun launch (:mod:`.worker`)."""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

VOCAB = 32
ROWS = 32
BASE = dict(report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no", seed=0,
            overwrite_output_dir=True, algorithm="fedavg", learning_rate=0.05, num_clients=4, clients_per_round=3,
            num_rounds=2, local_steps=2, per_device_train_batch_size=4, partition="iid", partition_report=False,
            eval_every_rounds=0, max_grad_norm=1.0)


@dataclass
class Outcome:
    state: Dict[str, torch.Tensor]  # trainable tensors after the run (gathered from FSDP shards)
    initial: Dict[str, torch.Tensor]  # the same tensors before it
    history: List[dict]
    masks: List[torch.Tensor] = field(default_factory=list)  # dropout masks (1 dropped, 0 kept, 2 no input)
    shard_masks: List[List[torch.Tensor]] = field(default_factory=list)  # per process, under a launch


def model(lora_dropout: float = 0.0):
    """A fresh copy of the reference model (built once per dropout rate)."""
    return copy.deepcopy(_model(lora_dropout))


@functools.lru_cache(maxsize=4)
def _model(lora_dropout: float):
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    base = LlamaForCausalLM(config)
    torch.manual_seed(1)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=lora_dropout,
                                           target_modules=["q_proj", "v_proj"],
                                           task_type=TaskType.CAUSAL_LM))


@functools.lru_cache(maxsize=8)
def rows(n: int = ROWS, lo: int = 4, hi: int = 16, seed: int = 0):
    """Rows of lo..hi random tokens (their own labels); ``lo == hi`` gives rows of one length."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(1, VOCAB, (int(torch.randint(lo, hi + 1, (), generator=g)),), generator=g).tolist()
           for _ in range(n)]
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


def collate(batch):
    """Right-padding to the batch's longest row (pad 0, label -100): batches of different widths."""
    width = max(len(r["input_ids"]) for r in batch)

    def pad(key, value):
        return torch.tensor([r[key] + [value] * (width - len(r[key])) for r in batch])

    mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in batch])
    return {"input_ids": pad("input_ids", 0), "attention_mask": mask, "labels": pad("labels", -100)}


def merge(*specs: dict) -> dict:
    """One configuration from features' declarations: settings, hooks, data and model overrides (later wins)."""
    out = {"settings": {}, "hooks": [], "data": {}, "model": {}, "resume": False, "masks": False}
    for spec in specs:
        out["settings"].update(copy.deepcopy(spec.get("settings", {})))
        out["hooks"] += [h for h in spec.get("hooks", ()) if h not in out["hooks"]]
        out["data"].update(spec.get("data", {}))
        out["model"].update(spec.get("model", {}))
        out["resume"] = out["resume"] or spec.get("resume", False)
        out["masks"] = out["masks"] or spec.get("masks", False)
    return out


def build(spec: dict, output_dir: str):
    """The trainer of one configuration (refusals raise here, before any work)."""
    from transformers import PrinterCallback

    from ..trainer.config.federated_config import FederatedConfig
    from ..trainer.federated_trainer import FederatedTrainer
    from .hooks import HOOKS

    data = spec["data"]
    train = rows(data.get("rows", ROWS), data.get("lo", 4), data.get("hi", 16))
    evaluation = rows(20, seed=1) if spec["settings"].get("eval_every_rounds") else None
    args = FederatedConfig(output_dir=output_dir, **{**BASE, **spec["settings"]})
    trainer = FederatedTrainer(model=model(**spec["model"]), args=args, train_dataset=train, eval_dataset=evaluation,
                               data_collator=collate, round_hooks=[HOOKS[h]() for h in spec["hooks"]])
    trainer.remove_callback(PrinterCallback)  # Trainer prints every log dict when tqdm is off
    return trainer


def _record_masks(trainer, masks: list) -> None:
    for name, module in trainer.model.named_modules():
        if name.endswith("q_proj.lora_dropout.default"):
            module.register_forward_hook(
                lambda m, i, o: masks.append(_mask(i[0], o)) if m.training else None)


def _mask(inputs: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """1 where dropout zeroed an entry, 0 where it kept it, 2 where the input was 0 already (padding's zero
    embedding): no information."""
    return torch.where(inputs == 0, 2, (outputs == 0).to(torch.int64)).to(torch.uint8)


class _StopAfterFirstRound:
    """A callback that ends the run after round 1 (its checkpoint written), as an interruption would."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Stop(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                control.should_training_stop = state.global_step >= 1
                return control

        return Stop()


def run(spec: dict, output_dir: Optional[str] = None) -> Outcome:
    """Train one configuration; with ``resume`` stop after round 1 and resume a fresh trainer from its checkpoint."""
    output_dir = output_dir or tempfile.mkdtemp(prefix="fedhf-matrix-")
    with _quiet():
        if spec["resume"]:
            spec = merge(spec, {"settings": {"save_every_rounds": 1}})
            first = build(spec, output_dir)
            first.add_callback(_StopAfterFirstRound())
            first.train()
            spec = merge(spec, {"settings": {"overwrite_output_dir": False}})
        trainer = build(spec, output_dir)
        initial = _trainable(trainer)
        masks: list = []
        if spec["masks"]:
            _record_masks(trainer, masks)
        trainer.train(resume_from_checkpoint=True if spec["resume"] else None)
    return Outcome(_trainable(trainer), initial, [dict(e) for e in trainer.federated_history], masks)


def _trainable(trainer) -> Dict[str, torch.Tensor]:
    names = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    state = trainer.shards.full_state_dict() if trainer.shards.active else trainer.model.state_dict()
    return {n: t.detach().float().clone() for n, t in state.items() if n in names}


@contextlib.contextmanager
def _quiet():
    """While a configuration trains: one thread, no fedhf chatter, and no history plot (a file output no oracle
    reads, and most of a tiny run's time); all restored after, as the run may share its process with other work
    (the suite)."""
    from unittest import mock

    from ..trainer.hooks import outputs

    logger, threads = logging.getLogger("fedhf"), torch.get_num_threads()
    level = logger.level
    logger.setLevel(logging.ERROR)
    torch.set_num_threads(1)
    try:
        with mock.patch.object(outputs, "plot_history", lambda *a, **k: None):
            yield
    finally:
        logger.setLevel(level)
        torch.set_num_threads(threads)
