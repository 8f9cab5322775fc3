"""2 processes (torchrun, gloo on CPU) give the same global model, and the same drift metrics, as 1 process."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.scripts.multiprocess_run import out_file

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "multiprocess_run.py")
BIN = os.path.dirname(sys.executable)
TORCHRUN = shutil.which("torchrun", path=BIN) or shutil.which("torchrun")
ACCELERATE = shutil.which("accelerate", path=BIN) or shutil.which("accelerate")


# A launch that failed to set up its process group on the loopback (a port taken between being picked and being
# bound) says nothing about fedhf; such a launch is retried once. Any other failure, and every mismatch, fails.
_LAUNCH_TROUBLE = ("EADDRINUSE", "Address already in use", "RendezvousConnectionError", "Connection refused",
                   "Connection reset by peer", "timed out initializing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(command, env):
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and any(marker in done.stderr for marker in _LAUNCH_TROUBLE):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    return done


def _run_here(script) -> str:
    """``python *script`` in this process (the 1-process reference: no interpreter start-up, ~10 s a launch): the
    script runs as ``__main__`` with its arguments; its stdout is returned, and torch's thread count (the scripts pin
    one) restored."""
    threads, argv, out = torch.get_num_threads(), sys.argv, io.StringIO()
    try:
        sys.argv = list(script)
        with contextlib.redirect_stdout(out):
            runpy.run_path(script[0], None, "__main__")  # (path, init_globals, run_name)
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)
    return out.getvalue()


def _run(n_processes, specs, out_dir, launcher="torchrun", readme=False, script_path=SCRIPT):
    """One launch of ``script_path`` (this file's run script, or client_parallel_run.py) trains every spec;
    {spec: saved tensors}."""
    out_dir.mkdir()
    script = [script_path, str(out_dir), *specs] + (["readme"] if readme else [])
    if n_processes == 1:
        assert _run_here(script).count("world_size 1") == len(specs)
        return {spec: load_file(out_file(str(out_dir), spec)) for spec in specs}
    if launcher == "torchrun":
        command = [TORCHRUN, "--standalone", "--nproc_per_node", str(n_processes), *script]
    else:  # the CPU command documented in docs/scaling.md (plain --cpu would start a single process)
        command = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", str(n_processes), "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
                   *script]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = _launch(command, env)
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr)
    assert done.stdout.count(f"world_size {n_processes}") == len(specs)
    return {spec: load_file(out_file(str(out_dir), spec)) for spec in specs}


SPECS = ["fedavg", "scaffold", "fedadam", "fedavg:median", "local_muon", "fedmuon", "fedpm", "fadam_gt"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """1 and 2 torchrun processes, launched once for all SPECS."""
    if TORCHRUN is None:
        pytest.skip("torchrun not installed")
    root = tmp_path_factory.mktemp("multiprocess")
    return {n: _run(n, SPECS, root / f"p{n}") for n in (1, 2)}


@pytest.mark.parametrize("algorithm", SPECS)
def test_two_processes_give_the_same_global_model_as_one(runs, algorithm):
    one, two = runs[1][algorithm], runs[2][algorithm]
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.skipif(ACCELERATE is None, reason="accelerate launcher not installed")
def test_accelerate_launch_gives_the_same_global_model(runs, tmp_path):
    one = runs[1]["scaffold"]
    two = _run(2, ["scaffold"], tmp_path / "two", launcher="accelerate")["scaffold"]
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-6, atol=1e-7, msg=name)


README_LAUNCHES = {"torchrun": ["scaffold", "fadam_gt"], "accelerate": ["fedpm"]}


@pytest.fixture(scope="module")
def readme_runs(tmp_path_factory):
    """docs/scaling.md's config: one 1-process launch for every spec, and one 2-process launch per launcher."""
    if TORCHRUN is None or ACCELERATE is None:
        pytest.skip("launchers not installed")
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only launch; with a GPU accelerate maps the processes itself")
    root = tmp_path_factory.mktemp("readme")
    runs = {"one": _run(1, [s for specs in README_LAUNCHES.values() for s in specs], root / "one", readme=True)}
    for launcher, specs in README_LAUNCHES.items():
        runs[launcher] = _run(2, specs, root / launcher, launcher=launcher, readme=True)
    return runs


@pytest.mark.parametrize("algorithm,launcher", [(s, launcher) for launcher, specs in README_LAUNCHES.items()
                                                for s in specs])
def test_readme_launch_commands_without_use_cpu_give_the_one_process_model(readme_runs, algorithm, launcher):
    """docs/scaling.md's commands with its config (no `use_cpu`) on a machine without a GPU: every process
    must be counted, or each trains every client and the sums double (SCAFFOLD's c, FAdamGT's y and FedPM's
    mixing depend on the count, so the model would differ, not just the logs)."""
    one, two = readme_runs["one"][algorithm], readme_runs[launcher][algorithm]
    assert float(two["history.participants"]) == float(one["history.participants"]) == 4.0  # clients_per_round
    torch.testing.assert_close(two["history.uplink_MB"], one["history.uplink_MB"], rtol=1e-12, atol=0)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-6, atol=1e-7, msg=name)


def test_the_cli_on_two_processes_says_so_once(tmp_path):
    """docs/scaling.md's CLI line on 2 CPU processes: the run announces its process count first, its history and
    card carry it, and the final summary is printed once (by process 0), not once per process."""
    import json

    if TORCHRUN is None:
        pytest.skip("torchrun not installed")
    recipe = os.path.join(os.path.dirname(SCRIPT), "..", "..", "recipes", "digits_resnet_fedpac_muon_dir0.5_n8.yaml")
    out = tmp_path / "run"
    command = [TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "fedhf", "train", "--config", recipe,
               "--num_rounds", "1", "--local_steps", "1", "--eval_every_rounds", "1", "--disable_tqdm", "true",
               "--partition_report", "false", "--output_dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = _launch(command, env)
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-3000:])
    assert done.stdout.count("fedhf: 2 processes (client_parallel: False, FSDP: False)") == 1, done.stdout
    assert done.stdout.count("-- outputs in") == 1, done.stdout
    assert json.loads((out / "federated_history.json").read_text())[-1]["processes"] == 2
    assert "| processes | 2 processes (client_parallel: False, FSDP: False)" in (out / "final" / "README.md").read_text()
