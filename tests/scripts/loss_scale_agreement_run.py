"""Run by tests/trainer/runners/test_loss_scaling.py under torchrun (2 processes, gloo): each process's GradScaler sees only its
own client's gradients -- process 1's overflows once -- then LossScale.agree; each process writes its scaler's state
to OUT_DIR/rank<R>.json."""

import json
import os
import sys

import torch
import torch.distributed as dist

from fedhf.trainer.runners.loss_scaling import LossScale

INIT_SCALE = 2.0 ** 16


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loss_scale = LossScale(torch.amp.GradScaler("cpu", init_scale=INIT_SCALE))
    weight = torch.nn.Parameter(torch.ones(3))
    # process 0: 5 clean steps; process 1: one overflow (step skipped, scale halved), then 2 clean steps
    gradients = [torch.ones(3)] * 5 if rank == 0 else [torch.full((3,), float("inf"))] + [torch.ones(3)] * 2
    for gradient in gradients:
        weight.grad = None
        loss_scale.scaler.scale((weight * gradient).sum()).backward()  # d/dweight = gradient x the scale
        loss_scale.step([weight], lambda: None)
        loss_scale.update()
    before = loss_scale.scaler.state_dict()
    loss_scale.agree(dist.get_world_size(), torch.device("cpu"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"before": before, "after": loss_scale.scaler.state_dict(),
                   "live_scale": loss_scale.scaler._scale.item()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
