"""Deployment parity: fedhf's tiny reference run through a real Flower deployment on loopback (a
``flower-superlink`` and two ``flower-supernode`` processes, nodes holding clients {0, 1} and {2, 3}, started by
``flwr run``) ends with the simulation's global model, bit for bit, for SCAFFOLD (whose c_i lives in each node's
Context.state between the two rounds). The simulation is the same app's ``make_trainer`` trained in this process.

One run only: a ``flwr run`` costs minutes here (a ServerApp and, per round and node, a ClientApp process, each
importing torch and building its trainer), and SCAFFOLD's path is FedAvg's (global tensors out, each client's sums
back) plus correction state both ways and node state between rounds; FedAvg and ten more settings cross the same
ServerApp and ClientApp in tests/flower/test_serverapp.py, and benchmarks/flower_parity.py deploys FedAvg, SCAFFOLD
and FedMuon."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from fedhf.core.params import trainable_parameters  # noqa: E402

from .tiny_app import app_module, deploy, max_difference, simulate  # noqa: E402

ALGORITHMS = ("scaffold",)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    return deploy(str(tmp_path_factory.mktemp("flower")), ALGORITHMS)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_deployment_ends_with_the_simulations_model(deployed, algorithm, tmp_path):
    simulated = simulate(algorithm, str(tmp_path / "simulated"))
    initial = {n: p.detach() for n, p in trainable_parameters(app_module().model()).items()}
    assert max_difference(simulated, initial) > 0  # the run trained: equality below is not of two untouched models
    assert max_difference(deployed[algorithm], simulated) == 0.0
