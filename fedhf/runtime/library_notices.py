"""Messages of fedhf's libraries that fedhf's own calls would trigger although the user did nothing to cause them;
each is dropped at the one place it arises, and nothing else is.

* bitsandbytes' kernel notice. peft imports bitsandbytes whenever it is installed (``peft/helpers.py``), and
  transformers' ``TrainingArguments`` imports peft, so loading the trainer loads bitsandbytes even when no model is
  quantised. On a CPU, bitsandbytes 0.49+ then logs, at import, "Failed to load CPU gemm_4bit_forward from
  kernels-community: No module named 'kernels'": it falls back to its own 4-bit matmul, and the notice only matters
  to someone who trains a 4-bit base on a CPU (``pip install kernels`` gives the faster kernel; docs/qlora_trl.md
  says so). :func:`silence_kernel_notice` filters that one record; ``fedhf/__init__.py`` installs it before any
  fedhf module can import peft (logging keeps a named logger's filters for the module that creates it later).
* peft's read of a deprecated property. ``get_peft_model`` reads ``model.is_gradient_checkpointing``, which
  transformers 5 deprecated for ``is_activation_checkpointing`` with a FutureWarning on every read: a warning about
  peft's code, shown to whoever wraps a model. :func:`quiet_peft_wrap` drops it around the wraps fedhf makes itself
  (a recipe's LoRA, trl's ``peft_config`` inside FederatedSFTTrainer), and :func:`ignore_checkpointing_alias`,
  installed by ``import fedhf``, drops it for a user's own ``get_peft_model`` call too: the user can do nothing
  about it, and a script that imports fedhf anywhere no longer shows it. Only that message is filtered.

What fedhf cannot drop: bitsandbytes logs its notice while it is imported, so a script that imports peft before
fedhf has printed it before fedhf exists (import fedhf first; docs/tutorial.md does). transformers' load report
("... MISSING: newly initialized") on a fresh classification head is a true statement, left alone.

Standard library only, so ``import fedhf`` pays nothing for it.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

KERNEL_NOTICE_LOGGER = "bitsandbytes.backends.cpu.ops"
KERNEL_NOTICE = "Failed to load CPU gemm_4bit_forward from kernels-community"
CHECKPOINTING_ALIAS = "`is_gradient_checkpointing` is deprecated"


class _DropKernelNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(KERNEL_NOTICE)


def silence_kernel_notice() -> None:
    """Drop bitsandbytes' "Failed to load CPU gemm_4bit_forward" notice (idempotent)."""
    logger = logging.getLogger(KERNEL_NOTICE_LOGGER)
    if not any(isinstance(f, _DropKernelNotice) for f in logger.filters):
        logger.addFilter(_DropKernelNotice())


def ignore_checkpointing_alias() -> None:
    """Drop transformers' FutureWarning for peft's read of ``is_gradient_checkpointing`` everywhere (idempotent:
    ``warnings.filterwarnings`` replaces an identical filter)."""
    warnings.filterwarnings("ignore", message=CHECKPOINTING_ALIAS, category=FutureWarning)


@contextmanager
def quiet_peft_wrap() -> Iterator[None]:
    """Inside the block, transformers' FutureWarning for peft's read of ``is_gradient_checkpointing`` is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=CHECKPOINTING_ALIAS, category=FutureWarning)
        yield
