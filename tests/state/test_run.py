"""The run fingerprint a checkpoint carries covers the split settings: resuming with another split is refused."""

from __future__ import annotations

import pytest

from fedhf.state.run import check_fingerprint, fingerprint

from ..helpers import config


@pytest.mark.parametrize("changed", [{"partition_key": "length"}, {"partition_key_buckets": 5},
                                     {"quantity_skew": 1.0}, {"client_eval_fraction": 0.1}])
def test_a_different_split_is_a_different_run(tmp_path, changed):
    args = config(tmp_path)
    stored = {"fingerprint": fingerprint(args, args.build_algorithm())}
    check_fingerprint("ckpt", stored, fingerprint(args, args.build_algorithm()))  # the same settings resume
    other = config(tmp_path, **changed)
    (name, value), = changed.items()
    with pytest.raises(ValueError, match=f"different run.*{name}: checkpoint .*, now {value!r}"):
        check_fingerprint("ckpt", stored, fingerprint(other, other.build_algorithm()))
