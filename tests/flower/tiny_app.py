"""The tests' shared pieces: the example app (examples/flower_app/, fedhf's tiny reference run), its simulation in
this process, and its deployment over real Flower processes (fedhf/flower/local_deployment.py).

Both sides run on one thread (the deployment's processes by OMP_NUM_THREADS=1, the simulation by
:func:`one_thread`): a matrix product's sums are ordered by the thread count, and the parity is bit for bit."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from types import SimpleNamespace
from typing import Dict, Sequence

import torch
from safetensors.torch import load_file

from fedhf.core.params import trainable_parameters
from fedhf.flower.local_deployment import local_deployment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APP = os.path.join(ROOT, "examples", "flower_app")
NODES = [[0, 1], [2, 3]]


@functools.lru_cache(maxsize=1)
def app_module():
    spec = importlib.util.spec_from_file_location("fedhf_tiny_app", os.path.join(APP, "fedhf_tiny_app.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_config(algorithm: str, output_dir: str, num_rounds: int = 2, min_nodes: int = 2) -> dict:
    return {"algorithm": algorithm, "num-rounds": num_rounds, "min-nodes": min_nodes, "output-dir": output_dir}


def simulate(algorithm: str, output_dir: str, **settings) -> Dict[str, torch.Tensor]:
    """The same run in one process: the app's own make_trainer, trained by FederatedTrainer."""
    context = SimpleNamespace(node_id=0, run_config=run_config(algorithm, output_dir))
    with one_thread():
        trainer = app_module().make_trainer(context, None, **settings)
        trainer.train()
    return {n: p.detach().clone() for n, p in trainable_parameters(trainer.model).items()}


def deployment_env() -> dict:
    """This checkout's fedhf on the processes' path, offline, one thread each."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
                HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
                TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")


def deploy(folder: str, algorithms: Sequence[str], nodes=NODES, timeout: float = 600.0) -> Dict[str, dict]:
    """Each algorithm's final trainable tensors from one real deployment (one ``flwr run`` each)."""
    results = {}
    with local_deployment(os.path.join(folder, "deployment"), nodes, deployment_env()) as deployment:
        for algorithm in algorithms:
            out = os.path.join(folder, f"flower-{algorithm}")
            log = deployment.run_app(APP, run_config(algorithm, out, min_nodes=len(nodes)), timeout=timeout)
            path = os.path.join(out, "server", app_module().RESULT)
            if not os.path.exists(path):
                raise RuntimeError(f"{algorithm}: the deployed run wrote no result; flwr run said:\n{log[-4000:]}\n"
                                   f"superlink:\n{deployment.log('superlink')[-4000:]}")
            results[algorithm] = load_file(path)
    return results


def max_difference(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a)
