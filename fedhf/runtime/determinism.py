"""What "1 process == N processes, bit for bit" needs, set or checked where fedhf can.

Every random draw already comes from a per-(seed, round, client) stream, so the clients compute the same things
wherever they run. What remains is floating-point summation order inside CPU kernels, which depends on the number
of torch intra-op threads: a 1-process run with 2 threads and a 2-process run with 1 thread each (torchrun sets
OMP_NUM_THREADS=1) differ after a few rounds (2e-3 after 3 FedMuon rounds, measured). With the same thread count in
every process they are bit-identical (tested with 1). ``full_determinism=True`` therefore also sets torch's thread
count to 1 in every process (Trainer already enables deterministic kernels for it); otherwise the count is recorded
in partition.json and a multi-process run warns if it is not 1.
"""

from __future__ import annotations

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)


def fix_thread_count(full_determinism: bool, world_size: int) -> int:
    """Returns the torch thread count this process uses."""
    if full_determinism:
        torch.set_num_threads(1)
    threads = torch.get_num_threads()
    if world_size > 1 and threads != 1:
        logger.warning("this process uses %d torch threads: the result equals a 1-process run bit for bit only with "
                       "the same thread count in both; set full_determinism=True (1 thread everywhere) or "
                       "OMP_NUM_THREADS alike", threads)
    return threads
