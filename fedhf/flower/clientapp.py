"""The ClientApp: a Flower node running fedhf's client half (Flower's Message API, ``@app.train``).

``make_trainer(context, partition_ids)`` builds the node's :class:`fedhf.FederatedTrainer`, the one the simulation
would build, holding at least the rows of its clients. Which clients a node trains is its node config's
``partition-ids`` (``flower-supernode --node-config "partition-ids='0,1'"``). A train message is one round: the
node checks the server's model against its own (a clear error naming the node), trains the round's sampled clients
among its ids (fedhf/flower/node_round.py) and answers its ids with each client's sums, and which of them it keeps
state for. A node sent a client whose kept state it does not hold (it restarted) stops the run with an error.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from ..core.params import TensorDict
from .node_round import (SENT_GROUPS, STORE, STORE_RAW, NodeRound, check_kept_state, check_same_settings,
                         run_settings)
from .records import from_record, to_record, unflatten_groups

TrainerFactory = Callable[[Context, Optional[List[int]]], object]  # (context, partition ids or None) -> trainer
PARTITION_IDS = "partition-ids"


def partition_ids(context: Context) -> List[int]:
    """The node config's ``partition-ids``: an int, or ids separated by commas or spaces."""
    if PARTITION_IDS not in context.node_config:
        raise ValueError(f"node {context.node_id}: no `{PARTITION_IDS}` in its node config; start it with "
                         f"flower-supernode --node-config \"{PARTITION_IDS}='0,1'\" (the fedhf clients it trains).")
    value = context.node_config[PARTITION_IDS]
    return sorted({int(v) for v in str(value).replace(",", " ").split()})


def node_name(context: Context) -> str:
    return f"node {context.node_id} (partition-ids {partition_ids(context)})"


def _load_store(trainer, context: Context) -> None:
    if STORE in context.state:
        trainer.client_store.load_tensors(from_record(context.state[STORE], context.state[STORE_RAW],
                                                      trainer.model_device))


def _save_store(trainer, context: Context) -> None:
    arrays, raw = to_record(trainer.client_store.to_tensors())
    context.state[STORE], context.state[STORE_RAW] = arrays, raw


def build_client_app(make_trainer: TrainerFactory) -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        trainer = make_trainer(context, partition_ids(context))
        config = message.content["fedhf"]
        check_same_settings(node_name(context), run_settings(trainer), str(config["settings"]))  # before any work
        node = NodeRound(trainer, node_name(context))
        _load_store(trainer, context)
        participants = [int(c) for c in config["participants"]]
        ids = partition_ids(context)
        clients = sorted(set(participants) & set(ids))  # this node's share of the round, in the simulation's order
        check_kept_state(node_name(context), trainer.client_store.clients(), clients, [int(c) for c in config["kept"]])
        content = message.content
        groups = unflatten_groups(from_record(content["fedhf.global"], content["fedhf.global.raw"],
                                              trainer.model_device), SENT_GROUPS)
        per_client = node.train(groups, int(config["round"]), float(config["round_lr"]), clients, participants)
        _save_store(trainer, context)
        kept = sorted(set(clients) & trainer.client_store.clients())  # the server sends them back as "kept"
        reply = RecordDict({"fedhf": ConfigRecord({PARTITION_IDS: ids, "trained": clients, "kept": kept})})
        for cid, tensors in per_client.items():
            reply[f"client.{cid}"], reply[f"client.{cid}.raw"] = to_record(tensors)
        return Message(reply, reply_to=message)

    return app


def client_tensors(reply: Message, client_id: int, device="cpu") -> TensorDict:
    """One client's sums from its node's reply, on ``device`` (the server's model device: the server halves combine
    them with the global model there, as the simulation's sums are made on it)."""
    return from_record(reply.content[f"client.{client_id}"], reply.content[f"client.{client_id}.raw"], device)

