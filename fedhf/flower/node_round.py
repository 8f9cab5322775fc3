"""A node's half of a round: fedhf's own client path on the node's clients, one at a time.

The node's trainer is the one the simulation would build (same config, model and partitions of its clients); its
runner (:class:`fedhf.trainer.runners.base.SequentialClients`, the simulation's default) trains each client exactly
as a simulated round does -- local steps, optimizer, correction, state-sync message, the round hooks' message
transforms (compression, error feedback) -- into that client's own :class:`~fedhf.core.sums.RoundSums`. The server
adds the clients' sums in client order, as the simulation adds their messages, so the round is the same numbers.

Per-client state that outlives a round (SCAFFOLD's c_i, kept Theta_i, compression residuals) lives in the trainer's
client store; between rounds it is kept in Flower's ``Context.state`` (:data:`STORE`), which never leaves the node.
"""

from __future__ import annotations

import json
from typing import Dict, Mapping, Sequence

from ..core.params import TensorDict, load_into
from ..core.sums import RoundSums
from ..state.run import RunState, fingerprint
from .records import sums_tensors

STORE = "fedhf.client_store"  # Context.state's ArrayRecord of the node's client store (ClientStateStore.to_tensors)
STORE_RAW = "fedhf.client_store.raw"
SENT_GROUPS = ("global_params", "global_buffers", "correction_state", "sync_state", "base_params")


def check_same_model(name: str, mine: Mapping, sent: Mapping) -> None:
    """The server's global tensors ``sent`` must be this node's federated tensors ``mine`` (names and shapes):
    else a clear error naming the node, before it trains."""
    own = {n: tuple(t.shape) for n, t in mine.items()}
    theirs = {n: tuple(t.shape) for n, t in sent.items()}
    if own != theirs:
        only_server = sorted(set(theirs.items()) - set(own.items()))
        only_node = sorted(set(own.items()) - set(theirs.items()))
        raise ValueError(f"{name}: the server's model does not match this node's: {len(only_server)} tensors "
                         f"(name, shape) only on the server {only_server[:3]}, {len(only_node)} only on the node "
                         f"{only_node[:3]}; build both from the same model and adapter config.")


def run_settings(trainer) -> str:
    """The settings that decide a round's numbers, as JSON: the fields a resumed run must match and the algorithm as
    built (fedhf/trainer/config/resume_fields.py), so a field added there is checked here too."""
    return json.dumps(fingerprint(trainer.args, trainer.algorithm), sort_keys=True, default=str)


def check_same_settings(name: str, mine: str, sent: str) -> None:
    """The server's :func:`run_settings` ``sent`` must be this node's ``mine``: a node built with another seed,
    local_steps, algorithm, batch size, ... would train its clients otherwise without any error."""
    own, theirs = json.loads(mine), json.loads(sent)
    differ = sorted(k for k in set(own) | set(theirs) if own.get(k) != theirs.get(k))
    if differ:
        details = "; ".join(f"{k}: server {theirs.get(k)!r}, node {own.get(k)!r}" for k in differ[:5])
        raise ValueError(f"{name}: {len(differ)} settings differ from the server's ({details}); build both trainers "
                         "from the same config (make_trainer).")


def check_kept_state(name: str, stored: set, clients: Sequence[int], kept: Sequence[int]) -> None:
    """The clients of this round whose state the server knows their node kept (``kept``) must have it in this node's
    store (``stored``): a node that restarted starts with an empty Context.state, and would train them from fresh
    state without any error."""
    lost = sorted(set(clients) & set(kept) - set(stored))
    if lost:
        raise RuntimeError(f"{name}: the state kept for clients {lost} since their last round (SCAFFOLD's c_i, kept "
                           "optimizer state, compression residuals) is not in this node's Context.state: the node "
                           "restarted (a SuperNode keeps Context.state in memory) or their partition-ids moved to it. "
                           "The run cannot go on as the simulation would; restart the server and every node (a "
                           "deployed run does not resume), and keep each client on one node for the whole run.")


class NodeRound:
    """A node's trainer readied for clients' rounds (the simulation readies it the same way when ``train`` starts)."""

    def __init__(self, trainer, name: str) -> None:
        self.trainer, self.name = trainer, name
        trainer._prepare_run(None)  # client data, loss scale, sharing plan, round hooks: the simulation's own
        trainer.is_in_train = True
        trainer.current_gradient_accumulation_steps = 1  # Trainer's divisor, as the run's callbacks begin it

    def train(self, groups: Dict[str, TensorDict], round_index: int, round_lr: float, clients: Sequence[int],
              participants: Sequence[int]) -> Dict[int, TensorDict]:
        """Train ``clients`` (this node's share of the round, in order) from the global state ``groups``; returns
        each client's round sums as tensors."""
        trainer = self.trainer
        check_same_model(self.name, trainer.plan.params, groups["global_params"])
        run = RunState(groups["global_params"], groups.get("global_buffers", {}), server_state={},
                       correction_state=groups.get("correction_state", {}), sync_state=groups.get("sync_state", {}),
                       base_params=groups.get("base_params", {}), rounds_done=round_index)
        trainer.base_fold.load(run.base_params)  # FedEx-LoRA, FLoRA: the folded base weights (else nothing)
        trainer.plan.begin_round(round_index)
        out = {}
        for cid in clients:
            sums = RoundSums()
            ctx = trainer.runner.context(run, cid, list(participants), round_lr)
            load_into(trainer.plan.params, run.global_params)
            load_into(trainer.plan.buffers, run.global_buffers)
            trainer.runner.train_chunk(run, [ctx], sums)
            out[cid] = sums_tensors(sums)
        trainer.plan.end_round()
        return out
