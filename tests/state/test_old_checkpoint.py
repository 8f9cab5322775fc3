"""A checkpoint written by an older fedhf (before the folder layout and the name-keyed server state) resumes."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import without_timings
from tests.scripts.resume_run import run_here

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "run_before_layout")


NEWER_FIELDS = {"processes"}  # history fields added after the fixture was written


def test_a_checkpoint_from_before_the_layout_resumes_to_the_uninterrupted_result(tmp_path):
    import json

    old = tmp_path / "old"
    shutil.copytree(FIXTURE, old)
    run_here(old, tmp_path / "resumed.safetensors", "--resume")
    run_here(tmp_path / "full", tmp_path / "full.safetensors")

    full, again = load_file(str(tmp_path / "full.safetensors")), load_file(str(tmp_path / "resumed.safetensors"))
    assert full.keys() == again.keys()
    # Rounds 1-2 of the fixture ran on the machine that wrote it; CPU kernels of another machine may round
    # differently, so equality is to float tolerance here (on one machine resuming is bit-exact: test_checkpoint.py).
    assert all(torch.allclose(full[k], again[k], rtol=1e-4, atol=1e-6) for k in full)
    history_full = json.loads((tmp_path / "full" / "federated_history.json").read_text())
    history_resumed = json.loads((old / "federated_history.json").read_text())
    assert [h["round"] for h in history_resumed] == [1, 2, 3, 4, 5]
    for resumed_entry, full_entry in zip(without_timings(history_resumed), without_timings(history_full)):
        # the fixture's own rounds predate the `processes` field every round now logs
        assert resumed_entry.keys() - NEWER_FIELDS == full_entry.keys() - NEWER_FIELDS
        assert all(resumed_entry[k] == pytest.approx(full_entry[k], rel=1e-4) for k in full_entry if k in resumed_entry)
