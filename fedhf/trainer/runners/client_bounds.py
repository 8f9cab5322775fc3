"""How many clients a run can touch, for the memory plan (memory_plan.py): those whose state the client store can
hold, and those a round's sums can gather. Bounded by the round policy's declaration under fixed-size sampling,
by a binomial tail under Poisson sampling, and by every client when a round hook resizes or adds to the sample."""

from __future__ import annotations

import math

from ..config.clock_policy import round_policy_of


def stored_clients(trainer) -> int:
    """The clients whose state this process can hold: a client's state is stored when it first trains, so under
    fixed-size sampling at most the trainings the round policy starts in ``num_rounds`` (clients_per_round a round;
    over-selected under a deadline; FedBuff's concurrency more). Poisson sampling, and a round hook that enlarges the
    sample, have no such bound: then every client counts."""
    args = trainer.args
    here = -(-args.num_clients // (1 if trainer.world.client_parallel else trainer.world.size))
    if not sample_bounded(trainer):
        return here
    return min(here, round_policy_of(args).clients_started(args.num_rounds))


def sample_bounded(trainer) -> bool:
    """Whether a round's clients are at most what the round policy declares: fixed-size sampling, and no round hook
    that resizes the sample or may add clients to it (a hook's ``select_clients`` may, except under secure
    aggregation, where the loop refuses an addition)."""
    hooks = trainer.hooks
    return (trainer.args.client_sampling == "fixed" and not hooks.resizes_sample
            and not (hooks.may_add_clients and not trainer.privacy.secure))


def round_participants(trainer) -> int:
    """The most clients a round's sums gather: clients_per_round under a bounded sample (a deadline round keeps at
    most that many reports); under Poisson sampling, a cohort size that no round exceeds but with probability 1e-6
    (:func:`poisson_cohort_bound`); any number of the clients under a hook that resizes the sample or adds to it."""
    args, hooks = trainer.args, trainer.hooks
    if sample_bounded(trainer):
        return args.clients_per_round
    if hooks.resizes_sample or (hooks.may_add_clients and not trainer.privacy.secure):
        return args.num_clients
    return poisson_cohort_bound(args.num_clients, args.clients_per_round / args.num_clients, args.num_rounds)


def poisson_cohort_bound(num_clients: int, rate: float, rounds: int, miss: float = 1e-6) -> int:
    """The smallest k such that the chance that any of ``rounds`` Poisson-sampled rounds (each of ``num_clients``
    clients in with probability ``rate``) has more than k clients is at most ``miss`` (a union bound over the
    rounds; the binomial tail summed exactly, in log space)."""
    if rate >= 1.0:
        return num_clients
    tail, n = miss / max(rounds, 1), num_clients
    log_p, log_q = math.log(rate), math.log1p(-rate)
    above = 0.0  # P(cohort > k), walking k down from n
    for k in range(n, -1, -1):
        pmf = math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
        if above + pmf > tail:
            return k
        above += pmf
    return 0
