"""The simulated clock as a round hook: which sampled clients a round keeps, and how long it lasts in simulated
seconds (docs/clock.md). The profiles and round policies are pure functions in fedhf/simulation/.

``select_clients`` runs before the runner: it over-selects under the deadline policy, drops the clients that are
offline this round (seeded per (seed, round, client)), times every online client - the broadcast over its downlink,
its tokens at its compute speed, its message over its uplink - and keeps what the round policy keeps. Clients that
are dropped do not train here: their result would be discarded, so the global model is the same and the simulation
skips the work (``sim_wasted_client_s`` counts what a deployment would have spent). Message sizes are the previous
round's measured bytes per client (the dense size in the first round), so a round can be timed before it runs.

The round's log gains ``sim_round_s``, ``sim_time_s`` (cumulative), ``sim_dropped``, ``sim_offline`` and
``sim_wasted_client_s``; ``clock_budget_s`` stops the run at the round that reaches it. The clock's state is in the
round checkpoint, so a resumed run continues the same clock. Without ``clock_profile`` the hook does nothing and a
round is today's, bit for bit.
"""

from __future__ import annotations

import math
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..core.params import TensorDict
from ..core.schedule import round_clients
from ..simulation import available_clients, client_seconds, csv_profiles, deadline_round, lognormal_profiles, \
    wait_for_all
from .clock_settings import PROFILES, clock_on
from .hooks import RoundHook


def profiles_of(args) -> list:
    if args.clock_profile in PROFILES:
        sigma = args.clock_spread if args.clock_profile == "lognormal" else 0.0
        return lognormal_profiles(args.num_clients, args.seed, args.clock_tokens_per_s, args.clock_uplink_mbps,
                                  args.clock_downlink_mbps, sigma, args.clock_availability)
    return csv_profiles(args.clock_profile, args.num_clients)


def tokens_per_round(trainer) -> List[float]:
    """Each client's tokens in one round: K x G x B rows at the mean length of its rows' ``input_ids`` (one token
    per row for data without them)."""
    args, dataset = trainer.args, trainer.train_dataset
    rows = args.local_steps * args.gradient_accumulation_steps * args.per_device_train_batch_size
    names = getattr(dataset, "column_names", None) or []
    lengths = np.array([len(x) for x in dataset["input_ids"]], dtype=np.float64) if "input_ids" in names else None
    return [rows * (float(lengths[list(part)].mean()) if lengths is not None and len(part) else 1.0)
            for part in trainer.client_partitions]


class VirtualClock(RoundHook):
    def __init__(self, trainer) -> None:
        args = self.args = trainer.args
        self.on = clock_on(args)
        self.seconds = 0.0
        self.timing, self.offline, self.dropped = None, 0, 0
        if self.on:
            self.profiles = profiles_of(args)
            self.tokens = tokens_per_round(trainer)
            dense = float(sum(t.numel() * t.element_size() for t in trainer.plan.params.values()))
            self.uplink_bytes = self.downlink_bytes = dense

    def select_clients(self, trainer, run, clients: Sequence[int]) -> List[int]:
        if not self.on:
            return list(clients)
        args, r = self.args, run.rounds_done
        if args.round_policy == "deadline" and args.over_selection > 0:
            sampled = min(args.num_clients, math.ceil((1 + args.over_selection) * args.clients_per_round))
            clients = round_clients(args.seed, r, args.num_clients, sampled, args.client_sampling)
        online = available_clients(args.seed, r, clients, self.profiles)
        self.offline = len(clients) - len(online)
        finish = {c: client_seconds(self.profiles[c], self.tokens[c], self.uplink_bytes, self.downlink_bytes)
                  for c in online}
        if args.round_policy == "deadline":
            self.timing = deadline_round(finish, args.round_deadline_s, args.clients_per_round)
        else:
            self.timing = wait_for_all(finish)
        self.dropped = len(online) - len(self.timing.kept)
        return list(self.timing.kept)

    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        if not self.on:
            return
        self.seconds += self.timing.seconds
        if sums.scalar("n") > 0:  # the next round's message sizes: this round's, per client
            self.uplink_bytes = sums.scalar("uplink_bytes") / sums.scalar("n")
            self.downlink_bytes = sums.scalar("downlink_bytes") / sums.scalar("n")
        entry.update({"sim_round_s": self.timing.seconds, "sim_time_s": self.seconds, "sim_dropped": self.dropped,
                      "sim_offline": self.offline, "sim_wasted_client_s": self.timing.wasted_seconds})

    def after_round(self, trainer, run, entry: dict) -> bool:
        if not self.on:
            return False
        entry.setdefault("sim_time_s", self.seconds)  # round 0 of eval_on_start
        return self.args.clock_budget_s is not None and self.seconds >= self.args.clock_budget_s

    def checkpoint_state(self, trainer, run) -> Tuple[dict, Dict[str, TensorDict]]:
        if not self.on:
            return {}, {}
        return {"clock": {"seconds": self.seconds, "uplink_bytes": self.uplink_bytes,
                          "downlink_bytes": self.downlink_bytes}}, {}

    def restore_state(self, trainer, run, meta: dict, groups: Dict[str, TensorDict]) -> None:
        if not self.on:
            return
        if "clock" not in meta:
            raise ValueError("The checkpoint holds no simulated clock (it was written without clock_profile): resume "
                             "it with clock_profile=None, or start a new run.")
        state = meta["clock"]
        self.seconds, self.uplink_bytes, self.downlink_bytes = (float(state["seconds"]), float(state["uplink_bytes"]),
                                                                float(state["downlink_bytes"]))
