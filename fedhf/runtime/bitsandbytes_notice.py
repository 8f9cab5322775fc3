"""Keep bitsandbytes' optional-kernel notice out of every fedhf command.

peft imports bitsandbytes whenever it is installed (``peft/helpers.py``), and transformers' ``TrainingArguments``
imports peft, so loading the trainer loads bitsandbytes even when no model is quantised. On a CPU, bitsandbytes
0.49+ then logs, at import, "Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'":
it falls back to its own 4-bit matmul, and the notice only matters to someone who trains a 4-bit base on a CPU
(``pip install kernels`` gives the faster kernel). This filter drops that one record and nothing else; it is
installed before anything of fedhf can import peft, and logging keeps a named logger's filters for the logger the
module creates later. Standard library only, so installing it costs nothing.
"""

from __future__ import annotations

import logging

KERNEL_NOTICE_LOGGER = "bitsandbytes.backends.cpu.ops"
KERNEL_NOTICE = "Failed to load CPU gemm_4bit_forward from kernels-community"


class _DropKernelNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(KERNEL_NOTICE)


def silence_kernel_notice() -> None:
    """Drop bitsandbytes' "Failed to load CPU gemm_4bit_forward" notice (idempotent)."""
    logger = logging.getLogger(KERNEL_NOTICE_LOGGER)
    if not any(isinstance(f, _DropKernelNotice) for f in logger.filters):
        logger.addFilter(_DropKernelNotice())
