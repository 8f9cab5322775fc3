"""Simulated time: what each client's round costs (device profiles) and which clients a round keeps (round
policies: pure functions, and the ``round_policy`` registry of thin objects over them in rounds.py). Pure
functions of (seed, round, client) and the profiles; the round hook that applies them to a run is
fedhf/trainer/hooks/clock.py."""

from .buffered import InFlight, buffered_round, next_arrivals, refill, staleness_weight
from .policy import RoundTiming, available_clients, client_seconds, deadline_round, over_selected, wait_for_all
from .profile import ClientProfile, csv_profiles, lognormal_profiles
from .rounds import ROUND_POLICIES, RoundPolicy, RoundSetup

__all__ = ["ClientProfile", "InFlight", "ROUND_POLICIES", "RoundPolicy", "RoundSetup", "RoundTiming",
           "available_clients", "buffered_round", "client_seconds", "csv_profiles", "deadline_round",
           "lognormal_profiles", "next_arrivals", "over_selected", "refill", "staleness_weight", "wait_for_all"]
