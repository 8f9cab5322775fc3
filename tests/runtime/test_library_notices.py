"""The library messages fedhf drops (fedhf/runtime/library_notices.py): exactly the one named, nothing beside it."""

from __future__ import annotations

import logging
import warnings

from fedhf.runtime.library_notices import (CHECKPOINTING_ALIAS, KERNEL_NOTICE, KERNEL_NOTICE_LOGGER, quiet_peft_wrap,
                                           silence_kernel_notice)


def test_the_kernel_notice_is_dropped_and_every_other_record_of_its_logger_kept(caplog):
    silence_kernel_notice()
    silence_kernel_notice()  # idempotent: one filter
    logger = logging.getLogger(KERNEL_NOTICE_LOGGER)
    assert len(logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=KERNEL_NOTICE_LOGGER):
        logger.warning(KERNEL_NOTICE + ": %s. Please make sure you already `pip install kernels`", "No module")
        logger.warning("some other bitsandbytes warning")
    assert [r.getMessage() for r in caplog.records] == ["some other bitsandbytes warning"]


def test_only_the_checkpointing_alias_warning_is_dropped_and_only_inside_the_block():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_peft_wrap():
            warnings.warn(CHECKPOINTING_ALIAS + " and will be removed in v6.", FutureWarning)
            warnings.warn("another FutureWarning", FutureWarning)
        warnings.warn(CHECKPOINTING_ALIAS + " and will be removed in v6.", FutureWarning)
    assert [str(w.message) for w in caught] == ["another FutureWarning",
                                                CHECKPOINTING_ALIAS + " and will be removed in v6."]


def test_import_fedhf_drops_the_checkpointing_alias_warning_for_the_users_own_calls():
    """A user's own get_peft_model (after `import fedhf`, anywhere in the script) shows no warning about peft's
    code; any other FutureWarning still shows."""
    import subprocess
    import sys

    code = ("import warnings, fedhf\n"
            f"warnings.warn({CHECKPOINTING_ALIAS!r} + ' and will be removed in v6.', FutureWarning)\n"
            "warnings.warn('another FutureWarning', FutureWarning)\n")
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, check=True)
    assert CHECKPOINTING_ALIAS not in done.stderr and "another FutureWarning" in done.stderr
