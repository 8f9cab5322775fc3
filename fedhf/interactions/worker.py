"""A torchrun launch that runs many 2-process configurations, one after another:

    torchrun --standalone --nproc_per_node 2 -m fedhf.interactions.worker SPECS.json OUT_DIR

SPECS.json maps a key to a configuration (:func:`fedhf.interactions.reference.merge`); process 0 writes
OUT_DIR/KEY.pt for each. A configuration that crashes after its build ends the launch (its collectives may be left
half done); the caller relaunches with the keys that have no result yet."""

from __future__ import annotations

import json
import os
import sys

import torch


def main(specs_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from .execute import execute

    torch.set_num_threads(1)
    with open(specs_file) as f:
        specs = json.load(f)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for key, spec in specs.items():
        if os.path.exists(os.path.join(out_dir, key + ".pt")):
            continue
        record = execute(spec, world=rank)
        if rank == 0:
            torch.save(record, os.path.join(out_dir, key + ".pt"))
        if "crash" in record:
            print(f"crash {key}: {record['crash']}", flush=True)
            sys.exit(3)
        dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
