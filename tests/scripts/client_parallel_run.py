"""A small federated LoRA run for test_client_parallel.py, launched with 1 or 2 processes:

    torchrun --standalone --nproc_per_node 2 tests/scripts/client_parallel_run.py OUT_DIR ALGORITHM [ALGORITHM ...]

writes OUT_DIR/ALGORITHM.safetensors per algorithm (one launch for all: a launch costs ~10 s of start-up).

Every process trains every client together (``client_parallel=True``): a tiny Llama with LoRA on real tweets,
2 micro-batches of 5 rows per local step (split 3 + 2 over two processes), gradient clipping on.
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fedhf import FederatedTrainer  # noqa: E402
from fedhf.data.sft import SFTCollator  # noqa: E402
from fedhf.data.demo import minilm_path  # noqa: E402
from tests.helpers import config, tiny_llama_lora, tweet_sft


def main(out_dir: str, algorithms) -> None:
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    data = tweet_sft(tokenizer, n_train=60, n_test=4, max_length=40)
    for algorithm in algorithms:
        train(algorithm, os.path.join(out_dir, f"{algorithm}.safetensors"), tokenizer, data)


def train(algorithm: str, out: str, tokenizer, data) -> None:
    model = tiny_llama_lora(len(tokenizer))
    args = config(pathlib.Path(out).with_suffix(""), algorithm=algorithm, client_parallel=True, num_clients=4,
                  clients_per_round=3, num_rounds=2, local_steps=2, per_device_train_batch_size=5,
                  gradient_accumulation_steps=2, max_grad_norm=0.5, partition="iid", partition_report=False,
                  learning_rate=1e-3 if algorithm != "scaffold" else 0.05)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=data["train"],
                               data_collator=SFTCollator(tokenizer))
    trainer.train()
    if trainer.is_world_process_zero():
        state = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        state.update({f"history.{k}": torch.tensor(float(v), dtype=torch.float64)
                      for k, v in trainer.federated_history[-1].items()
                      if k in ("participants", "uplink_MB", "downlink_MB", "train_loss")})
        save_file(state, out)
        print("world_size", args.world_size, "history", trainer.federated_history[-1])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
