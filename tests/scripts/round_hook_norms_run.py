"""examples/round_hook_update_norms.py under 1 or 2 processes, for test_process_totals.py:

    torchrun --standalone --nproc_per_node 2 tests/scripts/round_hook_norms_run.py OUT_DIR

writes OUT_DIR/norms.json (process 0): the example's logged update norms per round, and whether a hook whose
checkpoint state differs between the processes was refused at the first round checkpoint.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

from fedhf import RoundHook  # noqa: E402
from fedhf.data.demo import load_digits_images  # noqa: E402
from tests.helpers import config, digit_trainer, tiny_resnet  # noqa: E402


class ClientsSeenHere(RoundHook):
    """Counts the clients its own process trained: on 2 processes of 3 clients, 2 and 1."""

    def __init__(self) -> None:
        self.seen = 0

    def on_client_message(self, trainer, ctx, sent):
        self.seen += 1
        return sent

    def checkpoint_state(self, trainer, run):
        return {"seen_here": self.seen}, {}


def per_process_state_refused(out_dir: str) -> str:
    """'' when the run checkpoints, else the error's message."""
    import pathlib

    args = config(pathlib.Path(out_dir) / "per_process", num_clients=3, clients_per_round=3, num_rounds=1,
                  local_steps=1, save_every_rounds=1, partition_report=False)
    try:
        digit_trainer(tiny_resnet(), load_digits_images(), args, evaluate=False,
                      round_hooks=[ClientsSeenHere()]).train()
    except ValueError as error:
        return str(error)
    return ""


def main(out_dir: str) -> None:
    from round_hook_update_norms import main as example

    torch.set_num_threads(1)
    history = example(["--output_dir", os.path.join(out_dir, "example"), "--num_rounds", "2"])
    refused = per_process_state_refused(out_dir)
    if int(os.environ.get("RANK", "0")) == 0:
        keys = ("round", "participants", "update_norm_median", "update_norm_max", "blocked_clients_total")
        with open(os.path.join(out_dir, "norms.json"), "w") as f:
            json.dump({"history": [{k: e[k] for k in keys} for e in history], "refused": refused,
                       "world_size": int(os.environ.get("WORLD_SIZE", "1"))}, f)


if __name__ == "__main__":
    main(sys.argv[1])
