"""The run's round features as the list of round hooks (fedhf/trainer/hooks/base.py) the loop calls, in order.

A new round feature: its file with its hook, imported here, and its line in :func:`round_hooks`.
"""

from __future__ import annotations

from typing import List

from .clock import VirtualClock
from .compression import Compression
from .guards import ExclusionStop
from .base import RoundHook
from .neftune import NEFTune
from .outputs import Checkpoints, EvalOnStart, History, HistoryPlot, HubPush, PartitionReport
from .personal_eval import PersonalEvaluation
from .round_metrics import DriftMetrics
from .round_timer import RoundTimer
from .user_hooks_under_dp import user_hooks
from ..config.privacy_settings import dp_on


def round_hooks(trainer) -> List[RoundHook]:
    """The run's round features, in the order their events run. A hook whose setting is off does nothing. The
    user's hooks (``FederatedTrainer(round_hooks=...)``) come after the diagnostics, before the message transforms."""
    args = trainer.args
    return [
        PartitionReport(),  # partition_report: the clients' split, written once
        RoundTimer(),  # round_runtime in the history; one warning when an oversubscribed CPU slows rounds
        NEFTune(args.neftune_noise_alpha),  # embedding noise while training (Trainer attaches it in its own loop)
        EvalOnStart(),  # eval_on_start: round 0's evaluation
        DriftMetrics(args.drift_spectral),  # the preconditioner drift Delta_D of the clients' Theta_i
        # FederatedTrainer(round_hooks=[...]): what a user adds; under DP what they log is withheld unless declared
        *user_hooks(trainer.user_round_hooks, dp_on(args)),
        # uplink/downlink compression with error feedback; before any hook that must see what is summed (privacy)
        Compression(args.uplink_compression, args.downlink_compression, args.error_feedback,
                    trainer.algorithm.local_optimizer.cls, released=not dp_on(args)),
        ExclusionStop(args.max_excluded_rounds),  # stop a run whose every client is excluded
        # client-level DP and secure aggregation: after every hook that changes messages (its clip bounds exactly
        # what is summed), before History (its dp_epsilon goes into the round's entry)
        trainer.privacy,  # built by the trainer's run (fedhf/trainer/hooks/privacy.py): it samples the cohorts too
        # clock_profile: which clients a round uses and its simulated seconds; under fedbuff it holds each client's
        # messages until it reports, so it comes after every hook that changes messages
        VirtualClock(trainer),
        PersonalEvaluation(),  # personalized_eval: each client's own model on its held-out rows
        # the best evaluated round (load_best_model_at_end), after every evaluation (a personal_eval_* metric too),
        # before History and Checkpoints (which protect its checkpoint); checkpointed with the run
        trainer.best_round,
        History(),  # the history file, one entry per round
        Checkpoints(),  # round checkpoints (save_every_rounds, control.should_save), rotated
        HubPush(),  # push_to_hub: a round checkpoint's model, per hub_strategy
        HistoryPlot(),  # the history plotted at the end
    ]
