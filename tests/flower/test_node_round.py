"""A node's round: a server model that does not match the node's is refused before training, naming the node."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402

from fedhf.flower.node_round import NodeRound, check_same_model  # noqa: E402

from .tiny_app import app_module, run_config  # noqa: E402


def test_a_matching_model_passes():
    tensors = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    check_same_model("node 1", tensors, {k: v.clone() for k, v in tensors.items()})


@pytest.mark.parametrize("sent", [{"a": torch.zeros(3, 3), "b": torch.zeros(4)}, {"a": torch.zeros(2, 3)}])
def test_a_different_model_names_the_node(sent):
    with pytest.raises(ValueError, match=r"node 7 \(partition-ids \[0, 1\]\): the server's model does not match"):
        check_same_model("node 7 (partition-ids [0, 1])", {"a": torch.zeros(2, 3), "b": torch.zeros(4)}, sent)


def test_the_node_refuses_before_training(tmp_path):
    context = SimpleNamespace(node_id=3, run_config=run_config("fedavg", str(tmp_path)))
    trainer = app_module().make_trainer(context, [2, 3])
    node = NodeRound(trainer, "node 3 (partition-ids [2, 3])")
    before = {n: p.detach().clone() for n, p in trainer.plan.params.items()}
    wrong = {n + ".other": t.clone() for n, t in before.items()}  # another model's names
    with pytest.raises(ValueError, match=r"node 3 \(partition-ids \[2, 3\]\)"):
        node.train({"global_params": wrong}, 0, 0.05, [2], [0, 2, 3])
    assert all(torch.equal(p, before[n]) for n, p in trainer.plan.params.items())
