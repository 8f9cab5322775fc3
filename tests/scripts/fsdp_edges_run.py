"""Small runs for test_sharded_edges.py, launched once for every case:

    python tests/scripts/fsdp_edges_run.py OUT_DIR plain CASE [CASE ...]                                   (1 process)
    torchrun --standalone --nproc_per_node 2 tests/scripts/fsdp_edges_run.py OUT_DIR fsdp CASE [CASE ...]  (FSDP2)

A CASE is a name, or ``NAME:MODE`` to run it in another mode of the launch (``parallel``: client_parallel without
FSDP; ``spread``: clients spread over the processes). Each writes OUT_DIR/CASE.safetensors (tensors) and
OUT_DIR/CASE.json (numbers), process 0:

* ``svd-ALGORITHM``: 1 round x 1 local step of a low-rank state sync; the averaged Theta (the sync state of
  checkpoint-1, the processes' rows concatenated) and the uplink bytes;
* ``tail``: a client of 5 rows at batch 4 (its last batch has 1 row, fewer than the processes); the trained model;
* ``clock``: a deadline round policy whose first round drops clients; the rounds' clients and the trained model;
* ``eval``: ``evaluate()`` of the untrained model on 20 rows at eval batch 8 (the last batch partial);
* ``dropout``: LoRA dropout 0.5, a 5-row batch split 3 + 2; the fraction of the two shards' entries (row j of each)
  dropped alike, and whether the client's shared random stream is equal on both processes afterwards;
* ``gpu-state``: accelerate put in the state a GPU launch gives it (distributed type FSDP, an FSDP2 plugin with
  SHARDED_STATE_DICT), then ``evaluate()`` and ``save_model``.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, default_data_collator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fedhf import FederatedTrainer  # noqa: E402
from tests.helpers import config  # noqa: E402

VOCABULARY = 128


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCABULARY, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0,
        bos_token_id=None, eos_token_id=None))


def token_rows(n: int, seed: int = 0, length: int = 16) -> Dataset:
    """Rows of 6..16 random tokens right-padded to ``length`` (padding masked and labelled -100)."""
    g = torch.Generator().manual_seed(seed)
    ids, masks, labels = [], [], []
    for _ in range(n):
        k = int(torch.randint(6, length + 1, (), generator=g))
        seq = torch.randint(1, VOCABULARY, (k,), generator=g).tolist()
        ids.append(seq + [0] * (length - k))
        masks.append([1] * k + [0] * (length - k))
        labels.append(seq + [-100] * (length - k))
    return Dataset.from_dict({"input_ids": ids, "attention_mask": masks, "labels": labels})


def out_files(out_dir: str, case: str):
    stem = os.path.join(out_dir, case.replace(":", "-"))
    return stem + ".safetensors", stem + ".json"


def mode_settings(mode: str) -> dict:
    return {"fsdp": {"fsdp": "full_shard"}, "parallel": {"client_parallel": True}}.get(mode, {})


def trained(trainer) -> dict:
    state = trainer.shards.full_state_dict() if trainer.shards.active else trainer.model.state_dict()
    names = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    return {n: t.detach().float().contiguous() for n, t in state.items() if n in names}


def run_svd(folder, mode, algorithm):
    args = config(folder, algorithm=algorithm, learning_rate=1e-3, num_clients=4, clients_per_round=3, num_rounds=1,
                  local_steps=1, save_every_rounds=1, per_device_train_batch_size=5, partition="iid",
                  partition_report=False, **mode_settings(mode))
    trainer = FederatedTrainer(model=tiny_llama(), args=args, train_dataset=token_rows(80),
                               data_collator=default_data_collator)
    trainer.train()
    tensors = {}
    if trainer.is_world_process_zero():
        checkpoint = pathlib.Path(args.output_dir) / "checkpoint-1"
        if (checkpoint / "sync_state.safetensors").exists():
            tensors = load_file(checkpoint / "sync_state.safetensors")
        else:
            parts = [load_file(checkpoint / f"sync_state@rank{r}.safetensors") for r in range(args.world_size)]
            tensors = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return tensors, {"uplink_MB": trainer.federated_history[-1]["uplink_MB"]}


def run_tail(folder, mode):
    args = config(folder, num_clients=2, clients_per_round=2, num_rounds=2, local_steps=2, learning_rate=0.05,
                  per_device_train_batch_size=4, partition_report=False, **mode_settings(mode))
    trainer = FederatedTrainer(model=tiny_llama(), args=args, train_dataset=token_rows(13),
                               data_collator=default_data_collator,
                               client_partitions=[list(range(5)), list(range(5, 13))])
    trainer.train()
    return trained(trainer), {"train_loss": trainer.federated_history[-1]["train_loss"]}


def run_clock(folder, mode):
    args = config(folder, num_clients=8, clients_per_round=3, num_rounds=2, local_steps=1, learning_rate=0.05,
                  per_device_train_batch_size=4, partition="iid", partition_report=False,
                  clock_profile="lognormal", clock_uplink_mbps=0.5, clock_downlink_mbps=2.0, round_policy="deadline",
                  round_deadline_s=4.0, over_selection=1.0, **mode_settings(mode))
    trainer = FederatedTrainer(model=tiny_llama(), args=args, train_dataset=token_rows(80),
                               data_collator=default_data_collator)
    trainer.train()
    rounds = [{k: e[k] for k in ("participants", "sim_dropped", "sim_round_s")} for e in trainer.federated_history]
    return trained(trainer), {"rounds": rounds}


def run_eval(folder, mode):
    args = config(folder, num_rounds=1, per_device_eval_batch_size=8, partition="iid", partition_report=False,
                  **mode_settings(mode))
    trainer = FederatedTrainer(model=tiny_llama(), args=args, train_dataset=token_rows(80),
                               eval_dataset=token_rows(20, seed=1), data_collator=default_data_collator)
    return {}, {"eval_loss": trainer.evaluate()["eval_loss"]}


def run_dropout(folder, mode):
    from peft import LoraConfig, TaskType, get_peft_model

    torch.manual_seed(1)
    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=["q_proj"],
                                                    task_type=TaskType.CAUSAL_LM))
    seen = []  # per forward of this process's shard: entries dropped, and entries whose input is not 0
    dropout = model.base_model.model.model.layers[0].self_attn.q_proj.lora_dropout["default"]
    dropout.register_forward_hook(lambda m, i, o: seen.append(torch.stack([(o == 0), (i[0] != 0)]).float())
                                  if m.training else None)
    args = config(folder, num_clients=1, clients_per_round=1, num_rounds=1, local_steps=1, learning_rate=1e-3,
                  per_device_train_batch_size=5, partition="iid", partition_report=False,
                  **mode_settings(mode))
    trainer = FederatedTrainer(model=model, args=args, train_dataset=token_rows(5), data_collator=default_data_collator)
    trainer.train()
    shared = torch.get_rng_state()  # the client's shared stream, after the shards' forwards
    states = [torch.zeros_like(shared) for _ in range(2)]
    torch.distributed.all_gather(states, shared)
    first = seen[0][:, :2].contiguous()  # rows 0 and 1 of each shard (shards of 3 and 2 rows)
    parts = [torch.zeros_like(first) for _ in range(2)]
    torch.distributed.all_gather(parts, first)
    (dropped0, valid0), (dropped1, valid1) = parts
    both = (valid0 > 0) & (valid1 > 0)
    return {}, {"same": float((dropped0 == dropped1)[both].float().mean()), "compared": int(both.sum()),
                "drop_rate": float(dropped0[valid0 > 0].mean()),
                "shared_stream_equal": bool(torch.equal(states[0], states[1]))}


def run_gpu_state(folder, mode):
    """Trainer's FSDP paths as a GPU launch takes them: accelerate (on MULTI_CPU) is given the FSDP2 plugin and
    distributed type a MULTI_GPU launch gets, before the trainer is built."""
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType
    from transformers import Trainer

    original = Trainer.create_accelerator_and_postprocess

    def as_on_gpus(self):
        original(self)
        state = AcceleratorState()
        state.fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
        state.distributed_type = DistributedType.FSDP
        self.is_fsdp_enabled = True  # as Trainer reads it from a GPU launch's state

    Trainer.create_accelerator_and_postprocess = as_on_gpus
    try:
        args = config(folder, num_rounds=1, local_steps=1, per_device_eval_batch_size=8, partition="iid",
                      partition_report=False, **mode_settings(mode))
        trainer = FederatedTrainer(model=tiny_llama(), args=args, train_dataset=token_rows(40),
                                   eval_dataset=token_rows(20, seed=1), data_collator=default_data_collator)
    finally:
        Trainer.create_accelerator_and_postprocess = original
    trainer.train()
    loss = trainer.evaluate()["eval_loss"]
    saved = pathlib.Path(str(folder) + "-saved")
    trainer.save_model(str(saved))
    files = sorted(os.listdir(saved)) if saved.exists() else []
    return trained(trainer), {"eval_loss": loss, "saved": files}


RUNS = {"tail": run_tail, "clock": run_clock, "eval": run_eval, "dropout": run_dropout, "gpu-state": run_gpu_state}


def main(out_dir: str, launch_mode: str, cases) -> None:
    torch.set_num_threads(1)
    for case in cases:
        name, mode = (case.split(":") + [launch_mode])[:2]
        folder = pathlib.Path(out_files(out_dir, case)[0]).with_suffix("")
        if name.startswith("svd-"):
            tensors, numbers = run_svd(folder, mode, name[len("svd-"):])
        else:
            tensors, numbers = RUNS[name](folder, mode)
        if int(os.environ.get("RANK", "0")) == 0:
            tensor_file, number_file = out_files(out_dir, case)
            save_file(tensors, tensor_file)
            pathlib.Path(number_file).write_text(json.dumps(numbers))
            print("done", case, numbers, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
