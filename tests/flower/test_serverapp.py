"""The bridge's ServerApp and ClientApp in one process, through an in-process stand-in for Flower's Grid (no
transport: each message, serialised as Flower does, is handed to the node's ClientApp with a serialised copy of that
node's own Context, as a SuperNode does; replies come back out of order). Fast
checks of what tests/flower/test_parity.py checks over real processes, and of the errors a bad node gets."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict  # noqa: E402
from flwr.common.serde import (context_from_proto, context_to_proto, message_from_proto,  # noqa: E402
                               message_to_proto)

from fedhf.core.params import trainable_parameters  # noqa: E402
from fedhf.flower import build_client_app, build_server_app  # noqa: E402
from fedhf.flower.node_round import STORE  # noqa: E402

from .tiny_app import app_module, max_difference, one_thread, run_config, simulate  # noqa: E402


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Flower's ServerApp process knows its run and node (a message's sender); here each test sets them, restored
    after."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def over_the_wire(message: Message) -> Message:
    """What a process boundary does to a message: Flower's protobuf form and back (records serialised)."""
    return message_from_proto(message_to_proto(message))


def node_process_copy(context: Context) -> Context:
    """A ClientApp process's Context: the SuperNode's, serialised to it (and its state back when it replies)."""
    return context_from_proto(context_to_proto(context))


class InProcessGrid:
    """What RemoteClients uses of a Grid: the node ids, and send_and_receive (an exception becomes an error reply,
    as a SuperNode reports a failed ClientApp). Messages and node state cross Flower's serialisation, as between
    processes, and the replies come back in the reverse of the order sent (a real Grid returns them as they
    arrive)."""

    def __init__(self, client_app, contexts) -> None:
        self.client_app, self.contexts, self.messages = client_app, contexts, 0

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            self.messages += 1
            node = message.metadata.dst_node_id
            context = node_process_copy(self.contexts[node])
            try:
                replies.append(over_the_wire(self.client_app(over_the_wire(message), context)))
                self.contexts[node] = node_process_copy(context)  # the state the SuperNode keeps for the run
            except Exception as error:  # noqa: BLE001 -- the node's failure, reported to the server
                replies.append(Message(Error(code=0, reason=f"{type(error).__name__}: {error}"), reply_to=message))
        return replies[::-1]


def run_bridge(tmp_path, algorithm, settings=None, nodes=((0, 1), (2, 3)), node_factory=None, num_rounds=2,
               grid_type=None):
    """The app's ServerApp over its ClientApps in this process (one thread, as the deployment's processes)."""
    make = functools.partial(app_module().make_trainer, **(settings or {}))
    config = run_config(algorithm, str(tmp_path / "bridge"), num_rounds=num_rounds, min_nodes=len(nodes))
    contexts = {10 + i: Context(run_id=1, node_id=10 + i, node_config={"partition-ids": ",".join(map(str, ids))},
                                state=RecordDict(), run_config=config) for i, ids in enumerate(nodes)}
    grid = (grid_type or InProcessGrid)(build_client_app(node_factory or make), contexts)
    result = {}

    def keep(trainer, context):
        result.update({n: p.detach().clone() for n, p in trainable_parameters(trainer.model).items()})

    server = build_server_app(make, finish=keep, timeout=5.0)
    with one_thread():
        server(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))
    return result, grid, contexts


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_the_bridge_ends_with_the_simulations_model(tmp_path, algorithm):
    deployed, grid, contexts = run_bridge(tmp_path, algorithm)
    simulated = simulate(algorithm, str(tmp_path / "simulated"))
    assert sorted(deployed) == sorted(simulated)
    assert all(torch.equal(deployed[n], simulated[n]) for n in simulated)
    assert grid.messages == 4  # 2 rounds x 2 nodes (3 of 4 clients sampled: both nodes hold one in each round)
    if algorithm == "scaffold":  # c_i kept where Flower keeps node state, between rounds
        assert all(STORE in context.state for context in contexts.values())


VARIANTS = [  # (algorithm, more settings): what each exercises on the bridge
    ("fedmuon", {}),  # Muon's Newton-Schulz steps on the nodes
    ("fedpac_muon", {}),  # Thetabar broadcast: the state-sync message and its server half
    ("desloc", {}),  # each client's whole optimizer state kept in its node's Context.state
    ("fadam_gt", {}),  # gradient tracking: correction state both sides
    ("fedadam", {}),  # server optimizer state, in the ServerApp
    ("fedavg", {"server_rule": "median"}),  # a robust rule: each client's update travels, gathered in client order
    ("fedavg", {"server_rule": "fedex_lora"}),  # the base weights' residual folded and broadcast
    ("fedavg", {"lora_client_ranks": [2, 4, 4, 2], "server_rule": "flexlora"}),  # heterogeneous ranks
    ("fedavg", {"uplink_compression": "int8", "error_feedback": True}),  # residuals in Context.state
    ("fedavg", {"downlink_compression": "int8"}),  # the clients receive the server's x_hat
    # the whole state kept, but SGD has none: an empty entry is no kept state (not a node that lost it)
    ("fedavg", {"local_optimizer": "sgd", "state_sync": "persist_local", "state_sync_kwargs": {"keep": "state"},
                "num_rounds": 3}),
    # 4 rounds of 2 (seed 3: [0, 3], [2, 1], [0, 2], [0, 3]): client 0's c_i and residual wait in Context.state
    # through round 2, in which its node trains client 1 only, and are used again in round 3
    ("scaffold", {"seed": 3, "num_rounds": 4, "clients_per_round": 2, "uplink_compression": "int8",
                  "error_feedback": True}),
]


@pytest.mark.parametrize("algorithm, settings", VARIANTS, ids=lambda v: str(v))
def test_more_of_fedhf_ends_with_the_simulations_model(tmp_path, algorithm, settings):
    deployed, _, _ = run_bridge(tmp_path, algorithm, settings)
    simulated = simulate(algorithm, str(tmp_path / "simulated"), **settings)
    initial = {n: p.detach() for n, p in trainable_parameters(app_module().model()).items()}
    assert max_difference(simulated, initial) > 0
    assert max_difference(deployed, simulated) == 0.0


def other_model(context, partition_ids):
    """A node whose adapter is on q_proj only: other trainable tensors than the server's."""
    from peft import LoraConfig, TaskType, get_peft_model

    trainer = app_module().make_trainer(context, partition_ids)
    model = get_peft_model(app_module().model().unload(), LoraConfig(r=4, target_modules=["q_proj"],
                                                                     task_type=TaskType.CAUSAL_LM))
    return type(trainer)(model=model, args=trainer.args, train_dataset=trainer.train_dataset,
                         data_collator=trainer.data_collator)


def test_a_node_with_another_model_gets_an_error_naming_it(tmp_path):
    with pytest.raises(RuntimeError, match=r"round 1: node 1[01] failed: .*node 1[01] \(partition-ids \[.*\]\): "
                                           r"the server's model does not match this node's"):
        run_bridge(tmp_path, "fedavg", node_factory=other_model)


def test_a_client_no_node_holds_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"no connected node holds clients \[3\]"):
        run_bridge(tmp_path, "fedavg", {"clients_per_round": 4}, nodes=((0, 1), (2,)), num_rounds=1)


class RestartingGrid(InProcessGrid):
    """Every node restarts after round 1: its SuperNode comes back with an empty Context.state."""

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        for node in self.contexts:
            self.contexts[node].state = RecordDict()
        return replies


@pytest.mark.parametrize("algorithm", ["scaffold", "fedavg"])
def test_a_restarted_node_that_lost_its_clients_state_stops_the_run(tmp_path, algorithm):
    """SCAFFOLD's c_i live in Context.state: after a restart the node would train them from c_i = 0, silently
    another run (3 of 4 clients a round: a client of round 1 comes back in round 2). FedAvg keeps no client state,
    so a restart changes nothing and the run ends as the simulation's."""
    if algorithm == "scaffold":
        with pytest.raises(RuntimeError, match=r"round 2: node 1[01] failed: .*the state kept for clients \[\d"
                                               r".* is not in this node's Context.state: the node restarted"):
            run_bridge(tmp_path, algorithm, grid_type=RestartingGrid)
    else:
        deployed, _, _ = run_bridge(tmp_path, algorithm, grid_type=RestartingGrid)
        simulated = simulate(algorithm, str(tmp_path / "simulated"))
        assert max_difference(deployed, simulated) == 0.0


def test_a_refused_setting_stops_the_run_before_any_node_works(tmp_path):
    with pytest.raises(ValueError, match="batched_clients"):
        run_bridge(tmp_path, "fedavg", {"batched_clients": 2})


@pytest.mark.parametrize("other", [{"local_steps": 5}, {"seed": 7}, {"max_grad_norm": 0.01}, {"algorithm": "scaffold"}])
def test_a_node_built_with_other_settings_gets_an_error_naming_it(tmp_path, other):
    """Its model matches the server's, but its clients would train otherwise (without the check: a silently
    different model, up to 4e-3 away from the simulation's)."""
    node_factory = functools.partial(app_module().make_trainer, **other)
    with pytest.raises(RuntimeError, match=r"round 1: node 1[01] failed: .*node 1[01] \(partition-ids \[.*\]\): "
                                           rf"\d+ settings differ from the server's \(.*{next(iter(other))}: server"):
        run_bridge(tmp_path, "fedavg", node_factory=node_factory)


def test_the_clients_sums_are_put_on_the_servers_model_device():
    """A GPU server adds the nodes' sums to its global model on the GPU; they arrive as numpy arrays (CPU). Here the
    server's device is ``meta``, which a CPU has too (before the fix the sums stayed on the CPU)."""
    from types import SimpleNamespace

    from fedhf.core.sums import RoundSums
    from fedhf.flower import RemoteClients
    from fedhf.flower.records import to_record

    trainer = SimpleNamespace(model_device=torch.device("meta"),
                              hooks=SimpleNamespace(broadcast_bytes=lambda t, r, d: d),
                              args=SimpleNamespace(fingerprint_fields=lambda: ()),
                              algorithm=SimpleNamespace(describe=lambda: "fedavg"))
    run = SimpleNamespace(global_params={"w": torch.zeros(2)}, global_buffers={}, correction_state={}, sync_state={},
                          base_params={}, rounds_done=0)

    class OneNode:
        def get_node_ids(self):
            return [5]

        def send_and_receive(self, messages, *, timeout=None):
            reply = RecordDict({"fedhf": ConfigRecord({"partition-ids": [0], "trained": [0], "kept": []})})
            reply["client.0"], reply["client.0.raw"] = to_record({"dx.w": torch.ones(2, dtype=torch.float64)})
            return [Message(reply, reply_to=m) for m in messages]

    sums = RoundSums()
    RemoteClients(trainer, OneNode(), 1, 1.0).train_clients(run, [0], 0.1, sums)
    assert sums.get("dx.w").device.type == "meta"
