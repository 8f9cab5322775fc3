"""How a round's clients are trained, chosen once when the trainer is built (:func:`choose_runner`), as peft
resolves a LoRA variant once from its config:

* :class:`SequentialClients`: one client at a time on the resident model (the default);
* :class:`ClientParallelClients` (``client_parallel=True`` over several processes): every process trains every
  sampled client, each micro-batch split in row shards over the processes (fedhf/trainer/runners/client_parallel.py);
* :class:`ShardedClients` (``fsdp``): the same over an FSDP2-sharded model (fedhf/runtime/sharded.py);
* :class:`fedhf.trainer.runners.batched_round.BatchedClients` (``batched_clients = C > 1``): C clients share each
  forward/backward through stacked copies of the adapter.

A runner has one entry point, :meth:`Runner.train_clients`: this process's share of the round's clients, their
messages into the round's sums. Every runner trains a client with the same steps (fedhf/trainer/runners/client_round.py);
they differ only in which clients share a backward and how it is computed.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from tqdm.auto import tqdm

from ...core.context import ClientContext, TrainedPart
from ...core.params import load_into, num_bytes
from ...core.sums import RoundSums
from ...core.schedule import stream_seed
from .client_parallel import ForwardStream, accumulate_shards, all_reduce_gradients


class Runner:
    """Trains this process's clients of a round in chunks of ``size`` (each chunk from the global model)."""

    size = 1

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def downlink_bytes_each(self, run) -> int:
        """What one client of this round receives: the global state, as encoded when the downlink is compressed."""
        dense = sum(num_bytes(group) for group in (run.global_params, run.global_buffers, run.correction_state,
                                                   run.sync_state))
        dense += num_bytes(run.base_params) if run.rounds_done else 0  # FedEx-LoRA: the residual folded into the base
        return self.trainer.hooks.broadcast_bytes(self.trainer, run, dense)

    def train_clients(self, run, clients: Sequence[int], round_lr: float, sums: RoundSums) -> None:
        trainer, args, r = self.trainer, self.trainer.args, run.rounds_done
        downlink_each = self.downlink_bytes_each(run)
        mine = trainer.world.clients_of_this_process(sorted(clients))
        counted = sums if trainer.world.sends_messages else RoundSums()  # client_parallel: each client counted once
        chunks = [mine[i:i + self.size] for i in range(0, len(mine), self.size)]
        for chunk in tqdm(chunks, desc=f"round {r + 1}/{args.num_rounds}", leave=False,
                          disable=args.disable_tqdm or not trainer.is_local_process_zero()):
            contexts = [self.context(run, cid, clients, round_lr) for cid in chunk]
            load_into(trainer.plan.params, run.global_params)
            load_into(trainer.plan.buffers, run.global_buffers)
            self.train_chunk(run, contexts, counted)
            counted.add("downlink_bytes", downlink_each * len(chunk))

    def context(self, run, cid: int, clients: Sequence[int], round_lr: float) -> ClientContext:
        trainer, args, algo = self.trainer, self.trainer.args, self.trainer.algorithm
        return ClientContext(
            client_id=cid, round=run.rounds_done, round_lr=round_lr, local_lr=round_lr * algo.correction.lr_scale,
            local_steps=args.local_steps, weight=trainer.client_data.weight(cid), params=trainer.plan.params,
            global_params=run.global_params, correction_state=run.correction_state, store=trainer.client_store,
            sync_state=run.sync_state, participants=clients, num_clients=args.num_clients,
            trained=TrainedPart(trainer.plan.frozen_now(), trainer.plan.masks(cid)), layout=trainer.shards)

    def train_chunk(self, run, contexts: List[ClientContext], sums: RoundSums) -> None:
        raise NotImplementedError

    def backward(self, micro: List[List[dict]]) -> list:
        """A client trained alone (the trainer's ``_local_steps``): its gradients of one local step, from its
        step's micro-batches (``micro``, a list of one); returns its step loss in a list of one. Batched chunks
        give :meth:`ClientRound.steps_together <fedhf.trainer.runners.client_round.ClientRound.steps_together>`
        a backward of their own."""
        raise NotImplementedError

    def evaluate_clients(self, rows_of: Dict[int, Sequence[int]]) -> Optional[Dict[int, Dict[str, float]]]:
        """Personalised evaluation's metrics of these clients (client -> held-out rows) computed together, or
        None: one client at a time (fedhf/trainer/hooks/personal_eval.py)."""
        return None


class SequentialClients(Runner):
    """One client at a time: its personal tensors loaded, begin, K steps, finish (the trainer's per-client seams,
    each delegating once to its :class:`fedhf.trainer.runners.client_round.ClientRound`)."""

    def train_chunk(self, run, contexts: List[ClientContext], sums: RoundSums) -> None:
        trainer, ctx = self.trainer, contexts[0]
        trainer.plan.load_personal(trainer.client_store, ctx.client_id, run.personal_init)
        optimizer = trainer._begin_client(ctx)
        loss_sum = trainer._local_steps(ctx, optimizer)
        trainer._finish_client(ctx, optimizer, loss_sum, trainer.plan.buffers, sums)

    def backward(self, micro: List[List[dict]]) -> list:
        return [self.trainer.client_round.accumulate(micro[0])]


class ClientParallelClients(SequentialClients):
    """Every process trains the client; each micro-batch is split in row shards over the processes, whose forwards
    draw from this process's own stream of the client (seeded per client, round and process)."""

    FORWARD_STREAM = 5  # stream_seed's key of the shards' forwards (1: the client's shared stream, 2-3: its data)

    def train_chunk(self, run, contexts: List[ClientContext], sums: RoundSums) -> None:
        # the stream is made inside torch.random.fork_rng: the client's shared stream is untouched
        trainer, ctx = self.trainer, contexts[0]
        seed = stream_seed(trainer.args.seed, ctx.round, ctx.client_id, self.FORWARD_STREAM, trainer.world.rank)
        self.stream = ForwardStream(seed, trainer.model_device)
        super().train_chunk(run, contexts, sums)

    def reduce(self, params, loss: float) -> float:
        return all_reduce_gradients(params, loss)

    def backward(self, micro: List[List[dict]]) -> list:
        return [accumulate_shards(self.trainer, micro[0], self.reduce, self.stream)]


class ShardedClients(ClientParallelClients):
    """Client-parallel over an FSDP2-sharded model: FSDP sums the gradients into each process's shards."""

    def reduce(self, params, loss: float) -> float:
        return self.trainer.shards.step_gradients(params, loss)


def choose_runner(trainer) -> Runner:
    """The runner this trainer's settings ask for (their combinations are checked before, fedhf/trainer/config/combinations/)."""
    from .batched_round import BatchedClients

    args, world = trainer.args, trainer.world
    if args.batched_clients > 1:
        return BatchedClients(trainer)
    if trainer.shards.active:
        return ShardedClients(trainer)
    if world.client_parallel and world.size > 1:
        return ClientParallelClients(trainer)
    return SequentialClients(trainer)
