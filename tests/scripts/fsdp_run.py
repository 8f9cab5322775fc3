"""Small federated runs for test_sharded.py, launched once for every case:

    python tests/scripts/fsdp_run.py OUT_DIR plain CASE [CASE ...]                                    (1 process)
    torchrun --standalone --nproc_per_node 2 tests/scripts/fsdp_run.py OUT_DIR fsdp CASE [CASE ...]   (FSDP2)

A CASE is ``ALGORITHM:full`` (every weight of a 1-layer tiny Llama trained) or ``ALGORITHM:lora``, run in the
launch's mode; ``ALGORITHM:WEIGHTS:parallel`` runs client_parallel without FSDP instead (the 2-process reference),
``ALGORITHM:WEIGHTS:resume`` runs FSDP with round checkpoints, stopped after round 1 and resumed. Writes
OUT_DIR/CASE.safetensors per case: the trained tensors of the whole model (gathered from the shards under FSDP)
and the last round's history. The first full-weight case also calls ``save_model`` into OUT_DIR/CASE-saved (one
consolidated Hugging Face checkpoint, which the test loads with ``from_pretrained``).
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from peft import LoraConfig, TaskType, get_peft_model  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback, default_data_collator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fedhf import FederatedTrainer  # noqa: E402
from fedhf.data.demo import tiny_llama  # noqa: E402
from tests.helpers import config  # noqa: E402

VOCABULARY = 128
LEARNING_RATES = {"scaffold": 0.05, "fedavg": 0.05}  # SGD; the adaptive ones at 1e-3


def out_file(out_dir: str, case: str) -> str:
    return os.path.join(out_dir, case.replace(":", "-") + ".safetensors")


def token_rows(rows: int = 24, length: int = 16, seed: int = 0) -> Dataset:
    """Random token sequences over VOCABULARY, their own labels (a causal LM learns the next token)."""
    ids = torch.randint(1, VOCABULARY, (rows, length), generator=torch.Generator().manual_seed(seed)).tolist()
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * length] * rows, "labels": ids})


def main(out_dir: str, mode: str, cases) -> None:
    torch.set_num_threads(1)
    data = token_rows()
    for index, case in enumerate(cases):
        save = index == 0 and case.endswith(":full")
        train(case, out_dir, case.split(":")[2] if case.count(":") == 2 else mode, data, save)


class StopAfterFirstRound(TrainerCallback):
    """Ends the run after round 1 (its checkpoint written), as an interruption would."""

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= 1
        return control


def build(case: str, out_dir: str, mode: str, data) -> FederatedTrainer:
    algorithm, weights = case.split(":")[:2]
    model = tiny_llama(VOCABULARY, hidden_size=32, num_layers=1)
    if weights == "lora":
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type=TaskType.CAUSAL_LM,
                                                 target_modules=["q_proj", "v_proj"]))
    folder = pathlib.Path(out_file(out_dir, case)).with_suffix("")
    extra = ({"fsdp": "full_shard"} if mode == "fsdp" else {"fsdp": "full_shard", "save_every_rounds": 1}
             if mode == "resume" else {"client_parallel": True} if mode == "parallel" else {})
    args = config(folder, algorithm=algorithm, num_clients=2, clients_per_round=2, num_rounds=2, local_steps=2,
                  per_device_train_batch_size=4, max_grad_norm=0.5, partition="iid", partition_report=False,
                  learning_rate=LEARNING_RATES.get(algorithm, 1e-3), **extra)
    return FederatedTrainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)


def train(case: str, out_dir: str, mode: str, data, save: bool) -> None:
    """One case's run; ``resume``: stopped after round 1, then a fresh model and trainer resume its checkpoint."""
    trainer = build(case, out_dir, mode, data)
    if mode == "resume":
        trainer.add_callback(StopAfterFirstRound())
        trainer.train()
        first_run_rounds = len(trainer.federated_history)
        trainer = build(case, out_dir, mode, data)
        trainer.train(resume_from_checkpoint=True)
    else:
        trainer.train()
    model = trainer.model
    state = trainer.shards.full_state_dict() if trainer.shards.active else model.state_dict()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    folder = pathlib.Path(out_file(out_dir, case)).with_suffix("")
    if save:
        trainer.save_model(str(folder) + "-saved")
    if trainer.is_world_process_zero():
        out = {n: t.detach().float().contiguous() for n, t in state.items() if n in trained}
        out.update({f"history.{k}": torch.tensor(float(v), dtype=torch.float64)
                    for k, v in trainer.federated_history[-1].items()
                    if k in ("participants", "uplink_MB", "downlink_MB", "train_loss", "precond_drift")})
        if mode == "resume":
            out["history.first_run_rounds"] = torch.tensor(float(first_run_rounds), dtype=torch.float64)
        save_file(out, out_file(out_dir, case))
        print("world_size", trainer.args.world_size, case, trainer.federated_history[-1], flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
