"""The ServerApp: fedhf's own round loop (``FederatedTrainer.train``) with the clients' halves on Flower nodes.

The server builds the trainer the simulation builds and replaces only its runner -- the one object that trains a
round's clients (fedhf/trainer/runners/base.py) -- by :class:`RemoteClients`, which sends the round's global state to
the nodes holding the sampled clients and adds their replies into the round's sums in client order. Everything
else is the simulation's code: sampling, the learning-rate schedule, the correction's, state sync's and server
rule's server halves, downlink compression, logging, evaluation, checkpoints, the end of the run. Server-side state
(the global model, server optimizer state, SCAFFOLD's c) is the trainer's run state, in the ServerApp's process.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Set

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from ..core.sums import RoundSums
from ..trainer.runners.base import Runner
from .clientapp import PARTITION_IDS, TrainerFactory, client_tensors
from .node_round import SENT_GROUPS, run_settings
from .records import add_client_sums, flatten_groups, to_record
from .refusals import check_deployable

Finish = Callable[[object, Context], None]  # (trained trainer, context): what the run ends with


def _raise_errors(replies: Sequence[Message], what: str) -> None:
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(f"{what}: node {reply.metadata.src_node_id} failed: {reply.error.reason}")


def wait_for_nodes(grid: Grid, count: int, timeout: float, poll: float = 0.5) -> List[int]:
    """The connected nodes, once there are ``count`` of them (or a clear error after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(nodes)} of the {count} nodes the run waits for (min-nodes) connected within "
                               f"{timeout:.0f} s; start the missing flower-supernode processes.")
        time.sleep(poll)


class RemoteClients(Runner):
    """The runner whose clients train on Flower nodes. A node trains the round's sampled clients among its
    ``partition-ids`` and answers those ids: a round goes to the nodes known to hold its clients, or to every
    connected node while some sampled client's node is not known yet (the first round)."""

    def __init__(self, trainer, grid: Grid, min_nodes: int, timeout: Optional[float]) -> None:
        super().__init__(trainer)
        self.grid, self.min_nodes, self.timeout = grid, min_nodes, timeout
        self.owners: Dict[int, int] = {}  # client id -> node id, from the nodes' answers
        self.kept: Set[int] = set()  # clients whose node keeps state for them between rounds (the nodes' answers)

    def destinations(self, clients: Sequence[int]) -> List[int]:
        if all(c in self.owners for c in clients):
            return sorted({self.owners[c] for c in clients})
        return wait_for_nodes(self.grid, self.min_nodes, self.timeout or 600.0)

    def train_clients(self, run, clients: Sequence[int], round_lr: float, sums: RoundSums) -> None:
        arrays = flatten_groups({group: getattr(run, group) for group in SENT_GROUPS})
        config = {"round": run.rounds_done, "round_lr": float(round_lr), "participants": [int(c) for c in clients],
                  "settings": run_settings(self.trainer),  # each node checks its own against it
                  "kept": sorted(set(clients) & self.kept)}  # and that it still holds these clients' state
        messages = []
        for node in self.destinations(clients):
            record, raw = to_record(arrays)
            content = RecordDict({"fedhf.global": record, "fedhf.global.raw": raw, "fedhf": ConfigRecord(config)})
            messages.append(Message(content, dst_node_id=node, message_type=MessageType.TRAIN))
        replies = list(self.grid.send_and_receive(messages, timeout=self.timeout))
        what = f"round {run.rounds_done + 1}"
        _raise_errors(replies, what)
        if len(replies) < len(messages):
            raise TimeoutError(f"{what}: {len(messages) - len(replies)} of {len(messages)} nodes did not reply "
                               f"within {self.timeout} s")
        trained_by: Dict[int, Message] = {}
        for reply in replies:
            node, answer = reply.metadata.src_node_id, reply.content["fedhf"]
            for cid in answer[PARTITION_IDS]:
                if self.owners.setdefault(int(cid), node) != node:
                    raise ValueError(f"client {cid} is in the partition-ids of nodes {self.owners[int(cid)]} and "
                                     f"{node}; give each client to one node.")
            trained_by.update({int(cid): reply for cid in answer["trained"]})
            self.kept.difference_update(int(cid) for cid in answer["trained"])
            self.kept.update(int(cid) for cid in answer["kept"])
        missing = sorted(set(clients) - set(trained_by))
        if missing:
            raise ValueError(f"{what}: no connected node holds clients {missing} (nodes hold {sorted(self.owners)});"
                             " start a flower-supernode with their partition-ids, or raise min-nodes.")
        downlink_each = self.downlink_bytes_each(run)  # counted as the simulation's runner counts it
        for cid in sorted(clients):  # the simulation's order: each client's messages, then its downlink count
            add_client_sums(sums, cid, client_tensors(trained_by[cid], cid, self.trainer.model_device))
            sums.add("downlink_bytes", downlink_each)


def save_model(trainer, context: Context) -> None:
    trainer.save_model()  # into args.output_dir, as after a simulated run


def build_server_app(make_trainer: TrainerFactory, finish: Finish = save_model, min_nodes: Optional[int] = None,
                     timeout: Optional[float] = 600.0) -> ServerApp:
    """``min_nodes``: the nodes to wait for before the first round (default: the run config's ``min-nodes``, else
    1); ``timeout``: seconds to wait for them, and for each round's replies."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        trainer = make_trainer(context, None)
        check_deployable(trainer)  # before any node works
        count = min_nodes if min_nodes is not None else int(context.run_config.get("min-nodes", 1))
        trainer.runner = RemoteClients(trainer, grid, count, timeout)
        trainer.train()
        finish(trainer, context)

    return app
