"""Deployment parity: fedhf's tiny reference run through a real Flower deployment on loopback (a
``flower-superlink`` and two ``flower-supernode`` processes, nodes holding clients {0, 1} and {2, 3}, started by
``flwr run``) ends with the simulation's global model, bit for bit, for FedAvg and SCAFFOLD (whose c_i lives in each
node's Context.state between the two rounds). The simulation is the same app's ``make_trainer`` trained in this
process. One deployment serves both runs (each ``flwr run`` is a new run on it)."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from fedhf.core.params import trainable_parameters  # noqa: E402

from .tiny_app import app_module, deploy, max_difference, simulate  # noqa: E402

ALGORITHMS = ("fedavg", "scaffold")


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    return deploy(str(tmp_path_factory.mktemp("flower")), ALGORITHMS)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_deployment_ends_with_the_simulations_model(deployed, algorithm, tmp_path):
    simulated = simulate(algorithm, str(tmp_path / "simulated"))
    initial = {n: p.detach() for n, p in trainable_parameters(app_module().model()).items()}
    assert max_difference(simulated, initial) > 0  # the run trained: equality below is not of two untouched models
    assert max_difference(deployed[algorithm], simulated) == 0.0
