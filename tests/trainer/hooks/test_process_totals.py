"""A round hook under 2 processes (torchrun, gloo): examples/round_hook_update_norms.py logs the same update norms
as on 1 process (its clients' norms gathered over the processes), and a hook whose checkpoint state differs between
the processes is named at the first round checkpoint (one state is restored on every process)."""

from __future__ import annotations

import json
import os

import pytest

from tests.end_to_end.test_multiprocess import TORCHRUN, _launch, _run_here

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts",
                      "round_hook_norms_run.py")


def test_the_example_hook_logs_the_same_norms_on_two_processes_as_on_one(tmp_path):
    if TORCHRUN is None:
        pytest.skip("torchrun not installed")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    _run_here([SCRIPT, str(tmp_path / "one")])
    done = _launch([TORCHRUN, "--standalone", "--nproc_per_node", "2", SCRIPT, str(tmp_path / "two")],
                   {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-3000:])
    one = json.loads((tmp_path / "one" / "norms.json").read_text())
    two = json.loads((tmp_path / "two" / "norms.json").read_text())
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert [e["participants"] for e in one["history"]] == [e["participants"] for e in two["history"]]
    assert all(e["update_norm_median"] > 0 for e in one["history"])
    assert two["history"] == one["history"]  # the same clients' norms, gathered
    assert one["refused"] == ""
    assert "ClientsSeenHere" in two["refused"] and "differs between the processes" in two["refused"]
