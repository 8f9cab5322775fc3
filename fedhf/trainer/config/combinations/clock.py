"""Refused combinations of the simulated clock (each field's own value: clock_settings.py) and of its buffered
asynchronous aggregation, FedBuff (fedhf/trainer/hooks/clock.py, docs/clock.md)."""

from __future__ import annotations

from typing import List

from ..clock_settings import clock_on
from .refusal import SETTINGS, Refusal, Setup


def _buffered(s: Setup) -> bool:
    return s.args.clock_profile is not None and s.args.round_policy == "fedbuff"


# the clock's settings among themselves and with the other settings (read when the config is made)
FIELDS: List[Refusal] = [
    Refusal(lambda s: not clock_on(s.args) and (
                s.args.round_policy != "wait_all" or s.args.round_deadline_s is not None or s.args.over_selection != 0
                or s.args.clock_budget_s is not None or s.args.clock_availability != 1),
            lambda s: "a clock setting is set but `clock_profile` is None: set clock_profile='lognormal' (or "
                      "'uniform', or a CSV trace) to simulate time", needs=SETTINGS),
    Refusal(lambda s: s.args.round_policy == "deadline"
            and not (s.args.round_deadline_s is not None and s.args.round_deadline_s > 0),
            lambda s: "`round_policy='deadline'` needs `round_deadline_s` > 0 (the reporting deadline in simulated "
                      "seconds)", needs=SETTINGS),
    Refusal(lambda s: s.args.over_selection != 0 and s.args.round_policy != "deadline",
            lambda s: "`over_selection` only applies to round_policy='deadline' (wait_all keeps every sampled "
                      "client)", needs=SETTINGS),
    Refusal(lambda s: s.args.async_concurrency is not None
            and not (_buffered(s) and s.args.async_concurrency >= s.args.clients_per_round),
            lambda s: "`async_concurrency` applies to round_policy='fedbuff' and must be >= clients_per_round (the "
                      "reports the server waits for)", needs=SETTINGS),
    # FedBuff has no cohort: which clients enter an update follows their devices and the refill order, not a uniform
    # sample, so no subsampled event accounts it (one unamplified Gaussian per update, composed over every update a
    # client may report in, would: not written); the buffer of K reports is formed by arrival order, which no client
    # knows when it masks, so pairwise masks cannot be agreed (deployments sum the buffer in a trusted execution
    # environment instead: Huba et al., "Papaya", MLSys 2022).
    Refusal(lambda s: _buffered(s) and s.args.dp_mode != "off",
            lambda s: "round_policy='fedbuff' has no sampled cohort: the clients in a server update are chosen by "
                      "their devices and the refill order, not by the uniform sampling the DP accountant's "
                      "subsampled event assumes: use round_policy='deadline' (over-selection with a reporting "
                      "deadline) or 'wait_all' under dp_mode", needs=SETTINGS),
    Refusal(lambda s: _buffered(s) and s.args.secure_aggregation,
            lambda s: "round_policy='fedbuff' sums the first clients_per_round reports to arrive, which no client "
                      "knows when it masks, so secure aggregation's pairwise masks cannot be agreed among them: use "
                      "round_policy='deadline' (dropped clients' masks are removed by secure aggregation's "
                      "recovery) or 'wait_all'", needs=SETTINGS),
    Refusal(lambda s: _buffered(s) and s.args.downlink_compression != "none",
            lambda s: "round_policy='fedbuff' sends each client the model of its own moment, but a compressed "
                      "downlink assumes every client holds the server's last broadcast: set "
                      "downlink_compression='none'", needs=SETTINGS),
]

# what FedBuff cannot run with in the built trainer
WITH_THE_TRAINER: List[Refusal] = [
    Refusal(lambda s: _buffered(s) and s.rule.aggregator.name != "mean",
            lambda s: f"round_policy='fedbuff' weights each report's model change by its staleness, which is defined "
                      f"for a mean of changes; the aggregator {s.rule.aggregator.name!r} reads products, "
                      "preconditioners or each update, computed against different global models",
            "use an algorithm whose server rule averages changes (mean, with any server optimizer after it: fedavg, "
            "fedadam, diloco, ...) or round_policy='wait_all'"),
    Refusal(lambda s: _buffered(s) and s.world.size > 1,
            lambda s: f"round_policy='fedbuff' holds each training client's messages in the process that trained "
                      f"it; this run has {s.world.size} processes",
            "run fedbuff in one process"),
]
