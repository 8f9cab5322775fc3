"""The round policy a config runs: the ``round_policy`` registry's object (fedhf/simulation/rounds.py) built from the
clock's settings (clock_settings.py). The clock hook (fedhf/trainer/hooks/clock.py) asks it which clients a round
keeps; the privacy accountant (privacy_settings.py) asks it, before any round, how many a round samples."""

from __future__ import annotations

from ...simulation import ROUND_POLICIES, RoundPolicy, RoundSetup
from .clock_settings import clock_on


def report_cap(args) -> int:
    """The most reports a synchronous round keeps: clients_per_round, the first to arrive. Under DP with Poisson
    sampling every report within the deadline is kept instead: with a cap, one client's presence could push another
    client's report out, so the sum would move by up to 2C under add-or-remove-one, twice the sensitivity the
    accountant's Poisson event assumes (docs/privacy.md, "Dropped clients")."""
    if args.dp_mode != "off" and args.client_sampling == "poisson":
        return args.num_clients
    return args.clients_per_round


def round_policy_of(args) -> RoundPolicy:
    """The config's policy; without a clock a round waits for every sampled client, untimed (``wait_all``)."""
    name = args.round_policy if clock_on(args) else "wait_all"
    return ROUND_POLICIES[name](RoundSetup(args.clients_per_round, args.num_clients, report_cap(args),
                                           args.round_deadline_s, args.over_selection, args.async_concurrency))


def sampled_per_round(args) -> int:
    """How many clients the loop samples per round: the policy's sample size (clients_per_round; over-selected
    under the deadline policy). The loop asks the round hooks (``sample_size``), which the clock answers with this."""
    return round_policy_of(args).sample_size(args.clients_per_round)
