"""The run fingerprint a checkpoint carries covers the split, the local step (gradient accumulation, batched
clients, precision) and the best-model settings: resuming with another value is refused with the checkpoint's value
named; a checkpoint from before those settings existed resumes when they are at their defaults."""

from __future__ import annotations

import dataclasses
import re

import pytest

from fedhf import FederatedConfig
from fedhf.state.run import ADDED_FIELDS, UNRECORDED_FIELDS, check_fingerprint, fingerprint
from fedhf.trainer.config.resume_fields import RESUMABLE, fingerprint_fields, settings_bases

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


FEDBUFF = dict(clock_profile="lognormal", round_policy="fedbuff")


def test_a_resumed_fedbuff_run_with_another_async_concurrency_is_refused(tmp_path):
    """async_concurrency decides which clients train at once, so which reports fill each buffer: a resume with
    another value would continue a different run (the hand-kept field list had missed it)."""
    args = config(tmp_path, **FEDBUFF, async_concurrency=4)
    stored = {"fingerprint": fingerprint(args, args.build_algorithm())}
    other = config(tmp_path, **FEDBUFF, async_concurrency=8)
    with pytest.raises(ValueError, match="different run.*async_concurrency: checkpoint 4, now 8.*async_concurrency=4"):
        check_fingerprint("ckpt", stored, fingerprint(other, other.build_algorithm()))


def test_a_resumed_run_with_another_max_update_norm_is_refused(tmp_path):
    """max_update_norm decides which clients' updates are excluded from a round (the hand-kept list had missed it)."""
    args = config(tmp_path, max_update_norm=5.0)
    stored = {"fingerprint": fingerprint(args, args.build_algorithm())}
    other = config(tmp_path, max_update_norm=1.0)
    with pytest.raises(ValueError, match="max_update_norm: checkpoint 5.0, now 1.0"):
        check_fingerprint("ckpt", stored, fingerprint(other, other.build_algorithm()))


def _settings_fields():
    return {f.name: f for base in settings_bases(FederatedConfig) for f in dataclasses.fields(base)}


def test_every_settings_field_is_fingerprinted_or_declared_resumable():
    bases = {base.__module__ for base in settings_bases(FederatedConfig)}
    assert bases == {f"fedhf.trainer.config.{name}_settings" for name in
                     ("clock", "privacy", "compression", "partition")}
    fingerprinted = set(fingerprint_fields(FederatedConfig))
    for name in _settings_fields():
        assert (name in fingerprinted) != (name in RESUMABLE), name
    assert set(RESUMABLE) <= set(_settings_fields())  # no stale exclusion
    assert not set(RESUMABLE) & fingerprinted


def test_a_checkpoint_written_before_a_settings_field_was_fingerprinted_resumes_at_its_default(tmp_path):
    """Each settings field fingerprinted after the first checkpoints has its default in ADDED_FIELDS, or is one that
    checkpoints were written with before it was fingerprinted (UNRECORDED_FIELDS: its value unknown)."""
    first = {"partition", "partition_column", "dirichlet_alpha"}  # in the fingerprint since checkpoints exist
    fields = {name: f for name, f in _settings_fields().items() if name not in RESUMABLE and name not in first}
    assert not set(ADDED_FIELDS) & set(UNRECORDED_FIELDS)
    for name, f in fields.items():
        assert name in UNRECORDED_FIELDS or (name in ADDED_FIELDS and ADDED_FIELDS[name] == f.default), name
    args = config(tmp_path)
    older = {k: v for k, v in fingerprint(args, args.build_algorithm()).items() if k not in fields}
    check_fingerprint("ckpt", {"fingerprint": older}, fingerprint(args, args.build_algorithm()))


def test_a_subclass_of_the_config_fingerprints_the_same_fields(tmp_path):
    """FederatedSFTConfig (bases FederatedConfig and trl's SFTConfig) and a user's subclass keep FederatedConfig's
    settings groups: none of the TrainingArguments fields (output_dir, logging_steps, hub_token) enters the
    fingerprint, which meta.json must hold (an AcceleratorConfig could not be written), and a resume into another
    output_dir with another logging cadence is accepted."""
    import json

    from fedhf.trainer.sft import FederatedSFTConfig

    @dataclasses.dataclass
    class UserConfig(FederatedConfig):
        note: str = ""

    expected = fingerprint_fields(FederatedConfig)
    assert FederatedSFTConfig.settings_bases() == UserConfig.settings_bases() == settings_bases(FederatedConfig)
    common = dict(report_to="none", use_cpu=True, bf16=False, num_clients=2, num_rounds=2, local_steps=1)
    for cls in (FederatedSFTConfig, UserConfig):
        args = cls(output_dir=str(tmp_path / "run"), hub_token="hf_not_shown", **common)
        assert args.fingerprint_fields() == expected, cls.__name__
        stored = json.loads(json.dumps({"fingerprint": fingerprint(args, args.build_algorithm())}))
        assert "hf_not_shown" not in json.dumps(stored)
        other = cls(output_dir=str(tmp_path / "elsewhere"), logging_steps=7, **common)
        check_fingerprint("ckpt", stored, fingerprint(other, other.build_algorithm()))


def test_a_checkpoint_written_before_async_concurrency_was_fingerprinted_resumes_with_its_value(tmp_path):
    """A checkpoint of the hand-kept fingerprint (no async_concurrency, min_partition_size, ...) may have been written
    with any value of them: resumed with the same non-default values it is accepted, not refused at the default; a
    checkpoint that records them still refuses another value."""
    args = config(tmp_path, **FEDBUFF, async_concurrency=6, min_partition_size=2, dp_adaptive_clip_lr=0.5)
    now = fingerprint(args, args.build_algorithm())
    older = {k: v for k, v in now.items() if k not in UNRECORDED_FIELDS}
    check_fingerprint("ckpt", {"fingerprint": older}, now)
    other = config(tmp_path, **FEDBUFF, async_concurrency=6, min_partition_size=3, dp_adaptive_clip_lr=0.5)
    with pytest.raises(ValueError, match="min_partition_size: checkpoint 2, now 3"):
        check_fingerprint("ckpt", {"fingerprint": now}, fingerprint(other, other.build_algorithm()))
