"""A real Flower deployment on this machine's loopback: one ``flower-superlink`` and N ``flower-supernode``
processes (insecure, free ports, in a folder of their own), and ``flwr run`` of an app on them. For tests and
benchmarks; on real machines start the same commands on each machine with TLS (docs/deployment.md).

Every process this starts, and every process those start (SuperExec, the ServerApp's and ClientApps'), is ended when
the ``with`` block leaves, whatever happened in it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence

import psutil  # accelerate's dependency

CONNECTION = "fedhf-local"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tool(name: str) -> str:
    """A Flower command of this interpreter's environment (the SuperLink starts ``flower-superexec`` by name)."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.path.exists(path) else (shutil.which(name) or name)


class LocalDeployment:
    """The running processes and where they write (``folder``: logs, FLWR_HOME)."""

    def __init__(self, folder: str, env: Dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.processes: List[subprocess.Popen] = []
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"

    def start(self, name: str, command: List[str]) -> subprocess.Popen:
        log = open(os.path.join(self.folder, f"{name}.log"), "w")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.folder)
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        path = os.path.join(self.folder, f"{name}.log")
        return open(path).read() if os.path.exists(path) else ""

    def run_app(self, app_dir: str, run_config: Dict[str, object], timeout: float = 300.0) -> str:
        """``flwr run <app_dir> <connection> --run-config ... --stream``: returns the run's log once it finished."""
        pairs = " ".join(f"{k}={_toml(v)}" for k, v in run_config.items())
        done = subprocess.run([_tool("flwr"), "run", app_dir, CONNECTION, "--run-config", pairs, "--stream"],
                              env=self.env, cwd=self.folder, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"flwr run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout + done.stderr

    def stop(self) -> None:
        """Every process started here and their descendants (SuperExec, ServerApp, ClientApps): TERM, then KILL."""
        family = []
        for process in self.processes:
            try:
                family += psutil.Process(process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        for child in family:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


@contextmanager
def local_deployment(folder: str, node_partitions: Sequence[Sequence[int]],
                     env: Optional[Dict[str, str]] = None) -> Iterator[LocalDeployment]:
    """A SuperLink and one SuperNode per entry of ``node_partitions`` (its ``partition-ids``), insecure, on
    loopback; the Flower config (FLWR_HOME under ``folder``) names the SuperLink ``fedhf-local``."""
    os.makedirs(folder, exist_ok=True)
    home = os.path.join(folder, "flwr-home")
    os.makedirs(home, exist_ok=True)
    env = dict(os.environ if env is None else env, FLWR_HOME=home)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    deployment = LocalDeployment(folder, env)
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                f'address = "{deployment.address}"\ninsecure = true\n')
    try:
        deployment.start("superlink", [_tool("flower-superlink"), "--insecure", "--port", str(deployment.port),
                                       "--disable-runtime-dependency-installation",
                                       "--database", os.path.join(folder, "state.db")])
        _wait_for_port(deployment.port, deployment, "superlink")
        for index, ids in enumerate(node_partitions):
            ids_text = ",".join(str(int(i)) for i in ids)
            deployment.start(f"supernode-{index}", [
                _tool("flower-supernode"), "--insecure", "--superlink", deployment.address,
                "--port", str(free_port()), "--node-config", f"partition-ids='{ids_text}'"])
        yield deployment
    finally:
        deployment.stop()


def _wait_for_port(port: int, deployment: LocalDeployment, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if any(p.poll() is not None for p in deployment.processes):
            break
        time.sleep(0.2)
    raise RuntimeError(f"the {name} did not listen on port {port}:\n{deployment.log(name)[-3000:]}")

