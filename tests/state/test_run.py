"""The run fingerprint a checkpoint carries covers the split, the local step (gradient accumulation, batched
clients, precision) and the best-model settings: resuming with another value is refused with the checkpoint's value
named; a checkpoint from before those settings existed resumes when they are at their defaults."""

from __future__ import annotations

import re

import pytest

from fedhf.state.run import check_fingerprint, fingerprint

from tests.helpers import config


@pytest.mark.parametrize("changed", [{"partition_key": "length"}, {"partition_key_buckets": 5},
                                     {"quantity_skew": 1.0}, {"client_eval_fraction": 0.1},
                                     {"lora_client_ranks": [2, 2, 4, 4]}, {"gradient_accumulation_steps": 2},
                                     {"batched_clients": 2}, {"bf16": True}, {"metric_for_best_model": "accuracy"}])
def test_a_different_split_is_a_different_run(tmp_path, changed):
    args = config(tmp_path)
    stored = {"fingerprint": fingerprint(args, args.build_algorithm())}
    check_fingerprint("ckpt", stored, fingerprint(args, args.build_algorithm()))  # the same settings resume
    other = config(tmp_path, **changed)
    (name, value), = changed.items()
    fix = re.escape(f"{name}={getattr(args, name)!r}")  # resume with the checkpoint's value
    with pytest.raises(ValueError, match=f"different run.*{name}: checkpoint .*, now {re.escape(repr(value))}.*{fix}"):
        check_fingerprint("ckpt", stored, fingerprint(other, other.build_algorithm()))


def test_a_checkpoint_written_before_the_split_settings_existed_resumes_with_their_defaults(tmp_path):
    args = config(tmp_path)
    older = fingerprint(args, args.build_algorithm())
    for name in ("partition_key", "partition_key_buckets", "quantity_skew", "client_eval_fraction",
                 "gradient_accumulation_steps", "batched_clients", "bf16", "fp16", "metric_for_best_model",
                 "greater_is_better", "load_best_model_at_end"):
        del older[name]
    check_fingerprint("ckpt", {"fingerprint": older}, fingerprint(args, args.build_algorithm()))
    other = config(tmp_path, quantity_skew=1.0)
    with pytest.raises(ValueError, match="quantity_skew: checkpoint 0.0, now 1.0"):
        check_fingerprint("ckpt", {"fingerprint": older}, fingerprint(other, other.build_algorithm()))
