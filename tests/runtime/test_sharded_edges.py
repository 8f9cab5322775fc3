"""FSDP2 (and client_parallel) at its edges, 2 processes under torchrun against 1 process: a low-rank state sync
factorises whole matrices, a client's short last batch trains, the clock times round 1 with the whole model,
evaluation gives one process's eval_loss, the shards draw their own dropout masks, and Trainer's FSDP paths of a
GPU launch (accelerator.prepare(model) in evaluate, its own gather in save_model) are not taken. One launch of
each size runs every case (tests/scripts/fsdp_edges_run.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.end_to_end.test_multiprocess import TORCHRUN
from tests.runtime.test_sharded import ENV, _finish
from tests.scripts.fsdp_edges_run import out_files

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "fsdp_edges_run.py")
SYNCS = ["fedmuon_svd", "fedpac_soap_light"]  # a general (Muon) and a symmetric PSD (SOAP's L, R) factorisation
BOTH = [*(f"svd-{a}" for a in SYNCS), "tail", "clock", "eval"]
TWO_ONLY = ["eval:spread", "dropout", "dropout:parallel", "gpu-state"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if TORCHRUN is None:
        pytest.skip("torchrun not installed")
    root = tmp_path_factory.mktemp("fsdp-edges")
    one, two = root / "one", root / "two"
    one.mkdir(), two.mkdir()
    commands = [[sys.executable, SCRIPT, str(one), "plain", *BOTH],
                [TORCHRUN, "--standalone", "--nproc_per_node", "2", SCRIPT, str(two), "fsdp", *BOTH, *TWO_ONLY]]
    started = [subprocess.Popen(c, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for c in commands]
    for process, command in zip(started, commands):
        _finish(process, command)
    return {"one": one, "two": two}


def _load(folder, case):
    tensors, numbers = out_files(str(folder), case)
    return load_file(tensors), json.loads(open(numbers).read())


def _assert_models_close(one, two):
    assert one.keys() == two.keys() and one
    for name in one:  # measured: at most 7.5e-9 on these entries
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=5e-6, msg=name)


@pytest.mark.parametrize("algorithm", SYNCS)
def test_low_rank_state_sync_factorises_whole_matrices_under_fsdp(runs, algorithm):
    """Each Theta matrix is gathered before its factorisation: the averaged Theta and the uplink bytes are one
    process's (factorising each process's rows gave a matrix 126-187 % off, and other bytes)."""
    case = f"svd-{algorithm}"
    (one, one_numbers), (two, two_numbers) = _load(runs["one"], case), _load(runs["two"], case)
    assert one.keys() == two.keys() and any(t.ndim == 2 for t in one.values())
    for key in one:  # measured: 1.5e-6 relative
        scale = float(one[key].abs().max())
        assert float((two[key].double() - one[key].double()).abs().max()) <= 1e-4 * scale, key
    assert two_numbers["uplink_MB"] == one_numbers["uplink_MB"]


def test_a_client_short_last_batch_trains_under_fsdp_as_on_one_process(runs):
    """A client of 5 rows at batch 4 (a 1-row batch, fewer rows than processes): the empty shard's process runs a
    stand-in weighted 0, so the run ends with the 1-process model (it crashed mid-round)."""
    (one, one_numbers), (two, two_numbers) = _load(runs["one"], "tail"), _load(runs["two"], "tail")
    _assert_models_close(one, two)
    assert two_numbers["train_loss"] == pytest.approx(one_numbers["train_loss"], rel=1e-6)


def test_the_clock_times_round_one_with_the_whole_model_under_fsdp(runs):
    """A deadline that drops clients in round 1: the same clients kept, the same simulated seconds and model (with
    the shard's bytes round 1 kept 3 clients instead of 1)."""
    (one, one_numbers), (two, two_numbers) = _load(runs["one"], "clock"), _load(runs["two"], "clock")
    assert one_numbers["rounds"][0]["sim_dropped"] > 0 and one_numbers["rounds"][0]["participants"] > 0
    for a, b in zip(one_numbers["rounds"], two_numbers["rounds"], strict=True):
        assert (a["participants"], a["sim_dropped"]) == (b["participants"], b["sim_dropped"])
        assert a["sim_round_s"] == pytest.approx(b["sim_round_s"], rel=1e-9)
    _assert_models_close(one, two)


@pytest.mark.parametrize("case", ["eval", "eval:spread"])
def test_eval_loss_on_two_processes_is_the_one_process_loss(runs, case):
    """20 rows at eval batch 8 (a partial last batch): every process evaluates every row, so FSDP and spread
    clients give one process's eval_loss (Trainer's split and padded batch gave 4.8523 against 4.8586)."""
    one = _load(runs["one"], "eval")[1]["eval_loss"]
    assert _load(runs["two"], case)[1]["eval_loss"] == pytest.approx(one, rel=1e-6)


@pytest.mark.parametrize("case", ["dropout", "dropout:parallel"])
def test_row_shards_draw_their_own_dropout_masks(runs, case):
    """Row j of each process's shard: dropped alike in about half of the entries, as independent masks at rate 0.5
    are (identical masks: 1.0); the client's shared stream (curvature draws) stays equal on both processes although
    the shards (3 and 2 rows) drew different amounts."""
    numbers = _load(runs["two"], case)[1]
    assert numbers["compared"] >= 1000  # a standard deviation of at most 0.016 around 0.5
    assert 0.4 < numbers["drop_rate"] < 0.6
    assert 0.4 < numbers["same"] < 0.6, numbers
    assert numbers["shared_stream_equal"]


def test_trainer_fsdp_paths_of_a_gpu_launch_are_not_taken(runs):
    """accelerate in a GPU launch's state (distributed type FSDP, an FSDP2 plugin with SHARDED_STATE_DICT, so
    Trainer's is_fsdp_enabled): evaluate() runs on the resident sharded model and save_model writes fedhf's gathered
    model. Before, Trainer's evaluation called accelerator.prepare(model) and crashed (here accelerate wrapped the
    sharded model in DDP; on GPUs FSDP2 refuses a model without its optimizer), and Trainer's FSDP save path writes
    no weights under SHARDED_STATE_DICT."""
    state, numbers = _load(runs["two"], "gpu-state")
    assert math.isfinite(numbers["eval_loss"])
    assert "model.safetensors" in numbers["saved"]
    saved = load_file(str(runs["two"] / "gpu-state-saved" / "model.safetensors"))
    for name, tensor in state.items():
        torch.testing.assert_close(saved[name].float(), tensor, rtol=0, atol=0, msg=name)
