"""The simulated-clock fields of :class:`fedhf.FederatedConfig` (docs/clock.md), checked when the config is made.
The round hook that applies them is fedhf/trainer/hooks/clock.py; the profiles and round policies are fedhf/simulation/
(the policy a config runs: clock_policy.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from ...core.choices import closest, not_one_of
from ...simulation.rounds import ROUND_POLICIES as POLICY_CLASSES

PROFILES = ("uniform", "lognormal")  # or the path of a CSV trace
ROUND_POLICIES = tuple(POLICY_CLASSES)  # the choices: the registry's names (a new policy is its class and line there)


@dataclass
class ClockSettings:
    r"""
    A simulated clock with heterogeneous, straggling and dropping clients (docs/clock.md), a base of
    :class:`fedhf.FederatedConfig` (each parameter is its flag or recipe key).

    Parameters:
        clock_profile (`str`, *optional*): the clients' devices: uniform, lognormal or a CSV trace; None: no clock.
        clock_tokens_per_s (`float`, defaults to `2000.0`): the median client's training speed.
        clock_uplink_mbps, clock_downlink_mbps (`float`, defaults to `5.0`, `20.0`): the median client's links.
        clock_spread (`float`, defaults to `1.0`): the log-normal profile's sigma.
        clock_availability (`float`, defaults to `1.0`): the probability that a client is online in a round.
        round_policy (`str`, defaults to `"wait_all"`): wait for every client, a deadline with over-selection, or
            buffered asynchronous aggregation (fedbuff).
        round_deadline_s (`float`, *optional*): the deadline policy's reporting deadline in simulated seconds.
        over_selection (`float`, defaults to `0.0`): the deadline policy samples (1 + this) x clients_per_round.
        clock_budget_s (`float`, *optional*): stop after the round that reaches this many simulated seconds.
        async_concurrency (`int`, *optional*): fedbuff's clients training at once; default 2 x clients_per_round.
    """

    clock_profile: Optional[str] = field(
        default=None,
        metadata={"help": "Simulated time: the clients' device profile, 'uniform' (every client at the medians), "
                          "'lognormal' (each client's compute and network speed the median times exp(clock_spread "
                          "N(0,1)), heavy-tailed) or the path of a CSV trace (client_id,tokens_per_s,uplink_mbps,"
                          "downlink_mbps[,availability]). None: rounds have no notion of time (the default)."})
    clock_tokens_per_s: float = field(default=2000.0, metadata={"help": "The median client's training speed in "
                                                                        "tokens per second (rows without input_ids "
                                                                        "count as one token)."})
    clock_uplink_mbps: float = field(default=5.0, metadata={"help": "The median client's uplink in Mbit/s."})
    clock_downlink_mbps: float = field(default=20.0, metadata={"help": "The median client's downlink in Mbit/s."})
    clock_spread: float = field(default=1.0, metadata={"help": "The lognormal profile's sigma: 0 gives every client "
                                                               "the medians; 1 puts the 5 % slowest 5x below."})
    clock_availability: float = field(default=1.0, metadata={"help": "The probability that a sampled client is "
                                                                     "online in a round (a CSV trace's column "
                                                                     "overrides it); offline clients do not train."})
    round_policy: str = field(
        default="wait_all",
        metadata={"help": "'wait_all': the round waits for every sampled, online client (its slowest sets its "
                          "length). 'deadline': over-select, keep the first clients_per_round that report within "
                          "round_deadline_s and drop the rest (their work is wasted). 'fedbuff': buffered "
                          "asynchronous aggregation (Nguyen et al. 2022): async_concurrency clients always training, "
                          "the server updating after every clients_per_round reports, stale changes weighted by "
                          "1/sqrt(1 + staleness)."})
    round_deadline_s: Optional[float] = field(default=None, metadata={"help": "The deadline policy's reporting "
                                                                              "deadline, in simulated seconds."})
    over_selection: float = field(default=0.0, metadata={"help": "The deadline policy samples ceil((1 + this) x "
                                                                 "clients_per_round) clients, e.g. 0.3."})
    clock_budget_s: Optional[float] = field(default=None, metadata={"help": "Stop after the round at which the "
                                                                            "simulated time reaches this budget."})
    async_concurrency: Optional[int] = field(default=None, metadata={"help": "fedbuff: how many clients train at "
                                                                             "once; default 2 x clients_per_round."})


def clock_on(args) -> bool:
    return args.clock_profile is not None


def budget_reached(args, entry: dict) -> bool:
    """Whether the round logged in ``entry`` reached ``clock_budget_s``: the clock stops the run after it, so it is
    the run's last round."""
    return clock_on(args) and args.clock_budget_s is not None and entry["sim_time_s"] >= args.clock_budget_s


def check_clock_fields(args) -> None:
    """Each clock field's value, with the fix named; the combinations that cannot work are rows of the refusal
    table (fedhf/trainer/config/combinations/)."""
    on, profile = clock_on(args), args.clock_profile
    checks = [
        (not on or profile in PROFILES or os.path.isfile(str(profile)),
         f"`clock_profile` must be one of {PROFILES} or the path of a CSV trace; {profile!r} is neither"
         + closest(profile, PROFILES)),
        (args.clock_tokens_per_s > 0 and args.clock_uplink_mbps > 0 and args.clock_downlink_mbps > 0,
         "`clock_tokens_per_s`, `clock_uplink_mbps` and `clock_downlink_mbps` must be > 0"),
        (args.clock_spread >= 0, "`clock_spread` must be >= 0 (0: every client at the medians)"),
        (0 < args.clock_availability <= 1, "`clock_availability` must be in (0, 1]"),
        (args.round_policy in ROUND_POLICIES, not_one_of("round_policy", args.round_policy, ROUND_POLICIES)),
        (args.over_selection >= 0, "`over_selection` must be >= 0, e.g. 0.3"),
        (args.clock_budget_s is None or args.clock_budget_s > 0, "`clock_budget_s` must be > 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message + ".")
