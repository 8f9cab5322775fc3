"""What the Flower bridge refuses, checked on the server's trainer before any node works (docs/deployment.md,
"What does not carry over"). Each line says why: a feature that only exists inside one simulating process (the
simulated clock, batched clients, FSDP across processes), or one whose deployed form needs a protocol the bridge does
not wire (central DP's secret cohort and noise, secure aggregation's pairwise masks).
"""

from __future__ import annotations

from typing import Callable, List, Tuple

from ..runtime.sharded import sharding_requested
from ..sharing.plan import PERSONAL

Refusal = Tuple[Callable[[object], bool], str]

REFUSALS: List[Refusal] = [
    (lambda t: t.args.dp_mode != "off",
     "`dp_mode` (differential privacy): fedhf clips on the client and adds noise to the round's sum under a secret "
     "cohort draw inside one trainer; the bridge does not split that protocol across nodes (use Flower's DP mods "
     "or simulate)"),
    (lambda t: bool(t.args.secure_aggregation),
     "`secure_aggregation`: its pairwise masks need a key agreement between nodes that the bridge does not run "
     "(Flower's SecAgg+ mods do)"),
    (lambda t: t.args.clock_profile is not None,
     "`clock_profile` (the simulated clock): a deployment runs on real time; stragglers are real"),
    (lambda t: t.args.batched_clients > 1,
     "`batched_clients` > 1: a node trains its clients one at a time (batching is a simulation speed-up)"),
    (lambda t: bool(t.args.client_parallel) or t.world.size > 1,
     "`client_parallel` or a multi-process launch: each node is one process; spread clients over nodes instead"),
    (lambda t: sharding_requested(t.args),
     "`fsdp`: FSDP shards a model over the processes of one machine, not across Flower nodes"),
    (lambda t: PERSONAL in t.sharing_roles.values() or bool(t.sharing.personal_buffers(t.model, t.sharing_roles)),
     "personal tensors (`parameter_sharing`): the global model's personal part is the mean of every client's, "
     "which only the nodes hold"),
    (lambda t: bool(t.args.personalized_eval),
     "`personalized_eval`: each client's model and held-out rows stay on its node"),
    (lambda t: bool(t.args.drift_spectral),
     "`drift_spectral`: it needs every client's Theta_i on the server (the summed drift still travels)"),
    (lambda t: bool(t.args.neftune_noise_alpha),
     "`neftune_noise_alpha`: the embedding noise hook is attached by the server's run, not on the nodes"),
    (lambda t: t.args.client_state_budget_mb is not None,
     "`client_state_budget_mb`: a node's client state is kept between rounds in Flower's Context.state, in memory, "
     "all of it (a budget would spill nothing there); leave it unset, or give a node fewer clients"),
    (lambda t: bool(t.args.fp16),
     "`fp16`: the loss scale is one state shared by every client's steps in the simulation; nodes would diverge"),
]


def refusals(trainer) -> List[str]:
    """Why this trainer cannot run through Flower (empty: it can)."""
    return [reason for refused, reason in REFUSALS if refused(trainer)]


def check_deployable(trainer) -> None:
    reasons = refusals(trainer)
    if reasons:
        raise ValueError("fedhf.flower cannot deploy this run:\n  - " + "\n  - ".join(reasons)
                         + "\nSimulate it with FederatedTrainer, or turn these settings off.")
