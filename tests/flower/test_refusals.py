"""The bridge refuses, before any node works, what it cannot deploy, each with its reason; a plain run passes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")

from fedhf.flower import check_deployable, refusals  # noqa: E402

from .tiny_app import app_module, run_config  # noqa: E402


def trainer(tmp_path, algorithm="fedavg", **settings):
    context = SimpleNamespace(node_id=0, run_config=run_config(algorithm, str(tmp_path)))
    return app_module().make_trainer(context, None, **settings)


def test_a_plain_run_is_deployable(tmp_path):
    built = trainer(tmp_path, algorithm="scaffold")
    assert refusals(built) == []
    check_deployable(built)


@pytest.mark.parametrize("settings, named", [
    ({"batched_clients": 2}, "batched_clients"),
    ({"parameter_sharing": "fedsa"}, "personal tensors"),
    ({"client_state_budget_mb": 1.0}, "client_state_budget_mb"),  # Context.state holds every client's state
])
def test_what_cannot_be_deployed_is_refused_with_its_reason(tmp_path, settings, named):
    built = trainer(tmp_path, **settings)
    with pytest.raises(ValueError, match="cannot deploy") as error:
        check_deployable(built)
    assert named in str(error.value) and len(refusals(built)) == 1
