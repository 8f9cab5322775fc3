"""Checkpoints: a killed run resumes to the same model bit for bit; bad checkpoints are refused, never unpickled."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from fedhf.state import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from tests.helpers import without_timings
from tests.scripts.resume_run import run_here

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "resume_run.py")


def _start(out_dir, result, *flags) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, SCRIPT, str(out_dir), str(result), *flags], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("algorithm", [[], ["--algorithm", "fedmuon"], ["--algorithm", "fed_sophia"]],
                         ids=["scaffold+adam", "fedmuon", "fed_sophia"])
def test_a_killed_run_resumes_to_the_uninterrupted_result_bit_for_bit(tmp_path, algorithm):
    killed = _start(tmp_path / "crash", tmp_path / "never.safetensors", "--kill-after", "2", *algorithm)
    run_here(tmp_path / "full", tmp_path / "full.safetensors", *algorithm)  # beside the run that is killed
    _, stderr = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, stderr[-3000:]  # a real kill, not an exception
    assert not (tmp_path / "never.safetensors").exists()
    assert latest_checkpoint(str(tmp_path / "crash")).endswith("checkpoint-2")

    run_here(tmp_path / "crash", tmp_path / "resumed.safetensors", "--resume", *algorithm)

    full, again = load_file(str(tmp_path / "full.safetensors")), load_file(str(tmp_path / "resumed.safetensors"))
    assert full.keys() == again.keys()
    assert all(torch.equal(full[k], again[k]) for k in full)
    history_full = json.loads((tmp_path / "full" / "federated_history.json").read_text())
    history_resumed = json.loads((tmp_path / "crash" / "federated_history.json").read_text())
    assert [h["round"] for h in history_resumed] == [1, 2, 3, 4, 5]
    assert without_timings(history_resumed) == without_timings(history_full)


@pytest.fixture
def checkpoint(tmp_path):
    groups = {"global_params": {"w": torch.arange(6.0).reshape(2, 3)}, "client_store": {"3/c/w": torch.ones(2)}}
    return save_checkpoint(str(tmp_path / "checkpoint-4"), groups, {"rounds_done": 4})


def test_round_trip_is_exact(checkpoint):
    groups, meta = load_checkpoint(checkpoint)
    assert torch.equal(groups["global_params"]["w"], torch.arange(6.0).reshape(2, 3))
    assert meta == {"rounds_done": 4}


def test_truncated_file_is_refused(checkpoint):
    path = os.path.join(checkpoint, "global_params.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    with pytest.raises(CheckpointError, match="corrupted or truncated.*earlier checkpoint"):
        load_checkpoint(checkpoint)


def test_missing_manifest_is_refused_and_not_taken_as_latest(checkpoint, tmp_path):
    os.remove(os.path.join(checkpoint, "manifest.json"))
    with pytest.raises(CheckpointError, match="not a complete fedhf checkpoint"):
        load_checkpoint(checkpoint)
    assert latest_checkpoint(str(tmp_path)) is None


class _Booby:
    def __reduce__(self):
        return (os.makedirs, ("UNPICKLED_MARKER",))


def test_a_pickle_posing_as_tensors_is_refused_without_being_unpickled(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = os.path.join(checkpoint, "global_params.safetensors")
    with open(path, "wb") as f:
        pickle.dump(_Booby(), f)
    manifest_path = os.path.join(checkpoint, "manifest.json")
    manifest = json.loads(open(manifest_path).read())
    import hashlib

    manifest["files"]["global_params.safetensors"] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    open(manifest_path, "w").write(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="not valid safetensors"):
        load_checkpoint(checkpoint)
    assert not (tmp_path / "UNPICKLED_MARKER").exists()


def test_resuming_with_other_settings_is_refused(digits, tmp_path):
    from tests.helpers import config, digit_trainer, tiny_resnet

    args = config(tmp_path, num_rounds=1, local_steps=1, save_every_rounds=1)
    digit_trainer(tiny_resnet(), digits, args, evaluate=False).train()
    other = config(tmp_path, num_rounds=1, local_steps=2, save_every_rounds=1)
    with pytest.raises(ValueError, match="different run.*local_steps: checkpoint 1, now 2"):
        digit_trainer(tiny_resnet(), digits, other, evaluate=False).train(resume_from_checkpoint=True)
