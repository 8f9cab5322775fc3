"""A small federated run used by test_multiprocess.py, launched with 1 or 2 processes:

    torchrun --standalone --nproc_per_node 2 tests/scripts/multiprocess_run.py OUT_DIR ALGORITHM[:SERVER_RULE] [...] [readme]

writes OUT_DIR/<ALGORITHM[_SERVER_RULE]>.safetensors per spec (one launch for all: a launch costs ~10 s of
start-up).

``readme``: the config as docs/scaling.md writes it, without ``use_cpu=True`` (on a machine without a GPU,
FederatedConfig must still see every process).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fedhf.data.demo import load_digits_images  # noqa: E402
from tests.helpers import config, digit_trainer, tiny_resnet


def out_file(out_dir: str, spec: str) -> str:
    return os.path.join(out_dir, spec.replace(":", "_") + ".safetensors")


def main(out_dir: str, specs, readme: bool = False) -> None:
    for spec in specs:
        train(spec, out_file(out_dir, spec), readme)


def train(spec: str, out: str, readme: bool) -> None:
    """spec: ALGORITHM or ALGORITHM:SERVER_RULE (e.g. fedavg:median)."""
    import pathlib

    algorithm, _, server_rule = spec.partition(":")
    torch.set_num_threads(1)
    digits = load_digits_images()
    model = tiny_resnet()
    args = config(pathlib.Path(out).with_suffix(""), algorithm=algorithm, server_rule=server_rule or None,
                  num_clients=6,
                  clients_per_round=4, num_rounds=3, local_steps=3, dirichlet_alpha=0.5, partition_report=False,
                  drift_spectral=True, **({"use_cpu": False} if readme else {}))
    trainer = digit_trainer(model, digits, args, evaluate=False)
    trainer.train()
    if trainer.is_world_process_zero():
        state = {n: p.detach().contiguous() for n, p in model.named_parameters()}
        state.update({n: b.detach().contiguous() for n, b in model.named_buffers() if b.is_floating_point()})
        # The last round's drift metrics too: the spectral one takes a second all-reduce across processes.
        state.update({f"history.{k}": torch.tensor(v, dtype=torch.float64)
                      for k, v in trainer.federated_history[-1].items()
                      if k.startswith("precond_drift") or k in ("participants", "uplink_MB")})
        save_file(state, out)
        print("world_size", args.world_size, "history", trainer.federated_history[-1])


if __name__ == "__main__":
    readme = sys.argv[-1] == "readme"
    main(sys.argv[1], sys.argv[2:-1] if readme else sys.argv[2:], readme=readme)
