"""The process world: which processes share a run, read from one place.

Clients are spread over processes by a fixed map (client id modulo the number of processes), and a round ends
with one all-reduce of the summed messages. Both must count the same processes: if the map believed it was
alone while torch.distributed held two processes, each process would train every sampled client and the
all-reduce would add both copies (twice the participants, twice the bytes, and a wrong model for every server
rule whose update depends on the count, e.g. SCAFFOLD's c). :func:`process_world` is the single source both
read, and it refuses a run whose TrainingArguments disagree with torch.distributed.

Why they could disagree: under ``torchrun``/``accelerate launch`` on a machine without a GPU, accelerate
(1.x) initialises the process group (torch picks gloo) but, unless ``use_cpu=True``, reports
``DistributedType.NO`` with one process (it only maps a launch to MULTI_CPU when told it is on CPU).
:func:`cpu_only_launch` detects that case so FederatedConfig can set ``use_cpu`` before devices are set up.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch


def launched_processes() -> int:
    """How many processes the launcher started (torchrun, accelerate launch, mpirun); 1 when run directly."""
    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        if os.environ.get(name, "").strip().isdigit():
            return int(os.environ[name])
    return 1


def has_distributed_accelerator() -> bool:
    """A device accelerate can run one process per (CUDA, XPU, NPU, HPU, ...); Apple's MPS has no multi-process
    backend, so it counts as none here."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return accelerator is not None and accelerator.type != "mps"


def cpu_only_launch() -> bool:
    """Several processes launched on a machine whose only multi-process backend is the CPU (gloo)."""
    return launched_processes() > 1 and not has_distributed_accelerator()


@dataclass(frozen=True)
class ProcessWorld:
    rank: int = 0
    size: int = 1
    client_parallel: bool = False  # every process trains every client together (fedhf/trainer/runners/client_parallel.py)
    sharded: bool = False  # the resident model sharded with FSDP2 over the processes (fedhf/runtime/sharded.py)

    @property
    def sends_messages(self) -> bool:
        """Whether this process adds its clients' messages to the round's sums: under client_parallel every
        process holds the same messages, so only process 0 adds them (each client counted once); sharded, every
        process adds its own rows of them."""
        return not self.client_parallel or self.rank == 0 or self.sharded

    def owns(self, client_id: int) -> bool:
        """The fixed client -> process map (id modulo size): per-client state stays where its client trains."""
        return self.client_parallel or client_id % self.size == self.rank

    def clients_of_this_process(self, clients: Sequence[int]) -> List[int]:
        return [c for c in clients if self.owns(c)]

    def describe(self) -> str:
        """One line saying how many processes train and how the work is shared between them."""
        spread = ("every process trains every client together" if self.client_parallel
                  else f"clients spread by id mod {self.size}")
        noun = "process" if self.size == 1 else "processes"
        return f"{self.size} {noun} (client_parallel: {self.client_parallel}, FSDP: {self.sharded}), {spread}"


def launch_mismatch(world: ProcessWorld) -> Optional[str]:
    """Why a launch that asked for several processes trains on fewer, or None.

    ``accelerate launch --num_processes 2`` on a machine without a GPU runs accelerate's simple launcher: ONE
    process, with only MASTER_ADDR/MASTER_PORT set for the processes it did not start (it needs ``--multi_gpu``
    to start them). A launcher's WORLD_SIZE larger than torch.distributed's world is the same surprise."""
    asked = launched_processes()
    if asked > world.size:
        return (f"the launcher asked for {asked} processes (WORLD_SIZE) but torch.distributed holds {world.size}: "
                f"training runs on {world.size}.")
    accelerate = "ACCELERATE_MIXED_PRECISION" in os.environ  # set by every `accelerate launch`
    if world.size == 1 and accelerate and "MASTER_ADDR" in os.environ and "WORLD_SIZE" not in os.environ:
        return ("`accelerate launch` was asked for several processes (--num_processes > 1) but started one: on a "
                "machine without a GPU it starts them only with --multi_gpu, e.g. `accelerate launch --multi_gpu "
                "--num_processes 2 ...` (or `torchrun --standalone --nproc_per_node 2 ...`). Training runs on 1 "
                "process.")
    return None


def process_world(args, client_parallel: bool = False, sharded: bool = False) -> ProcessWorld:
    """The world torch.distributed holds, checked against what the TrainingArguments report; ``client_parallel``:
    every process trains every client together (``FederatedConfig.client_parallel``).

    Raises before any work when they disagree: spreading clients by one count and summing by another trains
    some clients twice (or never) and corrupts count-dependent server updates.
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        world = ProcessWorld(dist.get_rank(), dist.get_world_size(), client_parallel, sharded)
    else:
        world = ProcessWorld(client_parallel=client_parallel, sharded=sharded)
    if (world.size, world.rank) != (args.world_size, args.process_index):
        raise RuntimeError(
            f"torch.distributed holds {world.size} process(es) (this is rank {world.rank}) but the "
            f"TrainingArguments report world_size={args.world_size}, process_index={args.process_index}. Clients "
            "would be trained twice and summed twice. On a machine without a GPU create the config with "
            "`use_cpu=True` (FederatedConfig does this itself when it sees a CPU-only launch; a config built "
            "before torch.distributed was initialised, or with a custom `accelerator_config`, can miss it), or "
            "launch with a single process."
        )
    return world


def value_of_the_main_process(value):
    """``value`` as process 0 holds it, on every process (one broadcast; as it is when torch.distributed is not
    initialised). For what every process must agree on but only one may draw, e.g. the privacy secret."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def wait_for_every_process() -> None:
    """A barrier (nothing when torch.distributed is not initialised): e.g. before a resume reads the checkpoint
    folder, which process 0 may still be writing at the end of the previous ``train()``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


_teardown_registered = False


def destroy_process_group_at_exit() -> None:
    """Once per process, when torch.distributed is initialised: destroy its default group at interpreter exit.

    A process that ends with a live gloo group can die with SIGABRT after its work is done: gloo's worker
    threads still hold tensors whose release needs the GIL while the interpreter is being torn down
    (pytorch/pytorch#179291; it hit this repo's CI once, and is rare). ``atexit`` runs while Python is whole. A
    group the user's script destroyed itself is left alone.
    """
    global _teardown_registered
    dist = torch.distributed
    if _teardown_registered or not (dist.is_available() and dist.is_initialized()):
        return

    def teardown() -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    atexit.register(teardown)
    _teardown_registered = True
