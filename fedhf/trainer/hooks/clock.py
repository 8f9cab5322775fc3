"""The simulated clock as a round hook: which clients a round uses, and how long it lasts in simulated seconds
(docs/clock.md). The profiles are pure functions in fedhf/simulation/; the round policy is the ``round_policy``
registry's object (fedhf/simulation/rounds.py, built by fedhf/trainer/config/clock_policy.py), which this hook
asks and never names: it keeps the clock's state, times the clients and applies the policy's answers to the run.

The loop samples the policy's ``sample_size(target)`` clients (``sample_size`` here; ``target`` is clients_per_round
or what the round hooks before the clock answered; the deadline policy over-selects ceil((1 + over_selection) x
target)).

Synchronous policies (``wait_all``, ``deadline``): ``select_clients`` drops the clients that are offline this round
(seeded per (seed, round, client)), times every online client - the broadcast over its downlink, its tokens at its
compute speed, its message over its uplink - and keeps what the policy's ``close_round`` keeps. Dropped clients do
not train here: their result would be discarded, so the global model is the same and the simulation skips the work
(``sim_wasted_client_s`` counts what a deployment would have spent).

Buffered asynchronous aggregation (``fedbuff``, a policy whose ``buffered`` is True): ``select_clients`` replaces
the loop's sample by its dispatch: clients (in a seeded order of the online ones) until the policy's
``concurrency()`` are training; each trains now, from the current global model (its version), and
``on_client_message`` keeps its messages instead of summing them. ``after_sums`` then replaces the round's sums by
the reports the policy's ``close_round`` takes (the first ``clients_per_round`` on the clock): each report's model
change weighted by the policy's ``report_weight(staleness)``, every other sum (a correction's or a state sync's
change of the client's own state, the weight, the loss) entered once, unweighted. One round is one server update.

Message sizes are the previous round's measured bytes per client (the dense size in the first round), so a round can
be timed before it runs. The round's log gains ``sim_round_s``, ``sim_time_s`` (cumulative), ``sim_dropped``,
``sim_offline``, ``sim_wasted_client_s`` (and ``staleness_mean``/``staleness_max`` under fedbuff);
``clock_budget_s`` stops the run at the round that reaches it. The clock's state, the in-flight clients' messages
included, is in the round checkpoint, so a resumed run continues the same clock. Without ``clock_profile`` the hook
does nothing and a round is today's, bit for bit.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...core.message import Message
from ...core.params import TensorDict
from ...core.schedule import sample_clients
from ...simulation import InFlight, available_clients, client_seconds, csv_profiles, lognormal_profiles, refill
from ..config.clock_policy import round_policy_of
from ..config.clock_settings import PROFILES, clock_on
from ..config.privacy_settings import dp_on
from .base import ClientMessages, RoundHook

KEPT_SUMS = ("excluded", "downlink_bytes")  # fedbuff: what this round's training adds and its reports do not


def profiles_of(args, seed: Optional[int] = None) -> list:
    """Each client's device: drawn from ``seed`` (default ``args.seed``; the secret's under DP) for the log-normal
    and uniform profiles, or the user's trace, row by client id."""
    if args.clock_profile in PROFILES:
        sigma = args.clock_spread if args.clock_profile == "lognormal" else 0.0
        return lognormal_profiles(args.num_clients, args.seed if seed is None else seed, args.clock_tokens_per_s,
                                  args.clock_uplink_mbps, args.clock_downlink_mbps, sigma, args.clock_availability)
    return csv_profiles(args.clock_profile, args.num_clients)


def tokens_per_round(trainer) -> List[float]:
    """Each client's tokens in one round: K x G x B rows at the mean length of its rows' ``input_ids`` (one token
    per row for data without them). Under DP every client's rows count at the whole training set's mean length:
    with its own, a client's drop, the round's duration, the withheld round and the run's length under
    ``clock_budget_s`` would each be a function of that client's rows, outside the noise (docs/privacy.md)."""
    args, dataset = trainer.args, trainer.train_dataset
    rows = args.local_steps * args.gradient_accumulation_steps * args.per_device_train_batch_size
    names = getattr(dataset, "column_names", None) or []
    lengths = np.array([len(x) for x in dataset["input_ids"]], dtype=np.float64) if "input_ids" in names else None
    if lengths is not None and dp_on(args):
        return [rows * float(lengths.mean())] * len(trainer.client_partitions)
    return [rows * (float(lengths[list(part)].mean()) if lengths is not None and len(part) else 1.0)
            for part in trainer.client_partitions]


def flatten(sent: ClientMessages) -> TensorDict:
    """A client's messages by the keys their sums have, as float64 copies."""
    flat = {k: torch.as_tensor(v, dtype=torch.float64).clone() for k, v in sent.own.tensors.items()}
    for namespace, message in sent.components.items():
        flat.update({f"{namespace}.{k}": torch.as_tensor(v, dtype=torch.float64).clone()
                     for k, v in message.tensors.items()})
    return flat


class VirtualClock(RoundHook):
    sample_within_policy = True  # it over-selects as its round policy declares

    def __init__(self, trainer) -> None:
        args = self.args = trainer.args
        self.on = clock_on(args)
        self.policy = round_policy_of(args)
        self.buffered = self.on and self.policy.buffered
        self.seconds = 0.0
        self.timing, self.offline, self.dropped, self.staleness = None, 0, 0, []
        self.in_flight: List[InFlight] = []  # fedbuff: the clients training, in dispatch order
        self.reports: Dict[int, Tuple[TensorDict, int]] = {}  # fedbuff: their messages and bytes, until they report
        # the seed of the drawn devices and of who is online: under DP the secret's (trainer.privacy.cohort_seed),
        # since a reader who knew each client's device could tell from sim_round_s who was in the secret cohort
        # (a user's trace is public: docs/privacy.md); read at on_train_begin, after a resumed run's secret is back
        self.seed = args.seed
        if self.on:
            self.profiles = profiles_of(args)
            self.tokens = tokens_per_round(trainer)
            # the whole model's bytes: under FSDP plan.params are this process's shards, summed over processes
            dense = float(trainer.shards.total(torch.tensor(float(sum(t.numel() * t.element_size()
                                                                       for t in trainer.plan.params.values())))))
            self.uplink_bytes = self.downlink_bytes = dense

    def on_train_begin(self, trainer, run) -> None:
        if self.on and dp_on(self.args):
            self.seed = trainer.privacy.cohort_seed()
            self.profiles = profiles_of(self.args, self.seed)

    def _finish_time(self, cid: int) -> float:
        return client_seconds(self.profiles[cid], self.tokens[cid], self.uplink_bytes, self.downlink_bytes)

    # ------------------------------------------------------------------ which clients, how long
    def sample_size(self, trainer, run, default: int) -> int:
        # the previous hooks' answer is the round's target, which the policy may over-select; under DP no user hook is
        # asked (ReleasedOnly), so default is clients_per_round and the sample is the accountant's cohort
        return self.policy.sample_size(default) if self.on else default

    def select_clients(self, trainer, run, clients: Sequence[int]) -> List[int]:
        if not self.on:
            return list(clients)
        if self.buffered:
            run.started = self._dispatch(run.rounds_done)
            return list(run.started)
        r = run.rounds_done
        online = available_clients(self.seed, r, clients, self.profiles)
        self.offline = len(clients) - len(online)
        offline = set(clients) - set(online)  # never began; the late ones drop after they began (the recovery's)
        run.started = [c for c in run.started if c not in offline]
        finish = {c: self._finish_time(c) for c in online}
        self.timing = self.policy.close_round(finish, 0.0)  # timed from the round's start: every client begins now
        self.dropped = len(online) - len(self.timing.kept)
        return list(self.timing.kept)

    def _dispatch(self, r: int) -> List[int]:
        """FedBuff: refill the training clients to the concurrency, from a seeded order of the online clients."""
        args = self.args
        order = sample_clients(self.seed, r, args.num_clients, args.num_clients)
        online = available_clients(self.seed, r, order, self.profiles)
        self.offline = len(order) - len(online)
        new = refill(online, [f.client for f in self.in_flight], self.policy.concurrency() - len(self.in_flight))
        self.in_flight += [InFlight(c, r, self.seconds + self._finish_time(c)) for c in new]
        return new

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        if not self.buffered:
            return sent
        self.reports[ctx.client_id] = (flatten(sent), sent.nbytes)
        return ClientMessages(Message(), {}, {})  # nothing enters this round's sums: it reports later

    def after_sums(self, trainer, run, sums) -> None:
        if not self.buffered:
            return
        self.in_flight = [f for f in self.in_flight if f.client in self.reports]  # excluded clients never report
        self.timing = self.policy.close_round({f.client: f.finish for f in self.in_flight}, self.seconds)
        by_client = {f.client: f for f in self.in_flight}  # a client is in flight at most once (refill)
        arrived = [by_client[c] for c in self.timing.kept]  # in the order they arrive, as they enter the sums
        for key in sums.keys():
            if key not in KEPT_SUMS:
                sums.pop(key)
        self.staleness = [run.rounds_done - f.version for f in arrived]
        for report, staleness in zip(arrived, self.staleness):
            message, nbytes = self.reports.pop(report.client)
            alpha = self.policy.report_weight(staleness)
            for key, value in message.items():
                sums.add(key, value.to(trainer.model_device), alpha if key.startswith("dx.") else 1.0)
            sums.add("uplink_bytes", nbytes)
        self.in_flight = [f for f in self.in_flight if f not in arrived]

    # ------------------------------------------------------------------ the log, the budget, the checkpoint
    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        if not self.on:
            return
        self.seconds += self.timing.seconds
        if sums.scalar("n") > 0:  # the next round's message sizes: this round's, per client
            self.uplink_bytes = sums.scalar("uplink_bytes") / sums.scalar("n")
        if run.cohort:  # the download went to every client trained (fedbuff: dispatched), not only to the reports
            self.downlink_bytes = max(sums.scalar("downlink_bytes") / len(run.cohort), 1.0)
        entry.update({"sim_round_s": self.timing.seconds, "sim_time_s": self.seconds, "sim_dropped": self.dropped,
                      "sim_offline": self.offline, "sim_wasted_client_s": self.timing.wasted_seconds})
        if self.buffered and self.staleness:
            entry.update({"staleness_mean": float(np.mean(self.staleness)), "staleness_max": max(self.staleness)})

    def after_round(self, trainer, run, entry: dict) -> bool:
        if not self.on:
            return False
        entry.setdefault("sim_time_s", self.seconds)  # round 0 of eval_on_start
        return self.args.clock_budget_s is not None and self.seconds >= self.args.clock_budget_s

    def checkpoint_state(self, trainer, run) -> Tuple[dict, Dict[str, TensorDict]]:
        if not self.on:
            return {}, {}
        meta = {"seconds": self.seconds, "uplink_bytes": self.uplink_bytes, "downlink_bytes": self.downlink_bytes,
                "in_flight": [[f.client, f.version, f.finish] for f in self.in_flight],
                "report_bytes": {str(c): b for c, (_, b) in self.reports.items()}}
        return {"clock": meta}, {f"clock_report_{c}": message for c, (message, _) in self.reports.items()}

    def restore_state(self, trainer, run, meta: dict, groups: Dict[str, TensorDict]) -> None:
        if not self.on:
            return
        if "clock" not in meta:
            raise ValueError("The checkpoint holds no simulated clock (it was written without clock_profile): resume "
                             "it with clock_profile=None, or start a new run.")
        state = meta["clock"]
        self.seconds, self.uplink_bytes, self.downlink_bytes = (float(state["seconds"]), float(state["uplink_bytes"]),
                                                                float(state["downlink_bytes"]))
        self.in_flight = [InFlight(int(c), int(v), float(t)) for c, v, t in state.get("in_flight", [])]
        self.reports = {int(c): ({k: t.to(trainer.model_device) for k, t in groups[f"clock_report_{c}"].items()},
                                 int(b)) for c, b in state.get("report_bytes", {}).items()}
