"""Simulated time: what each client's round costs (device profiles) and which clients a round keeps (round
policies). Pure functions of (seed, round, client) and the profiles; the round hook that applies them to a run is
fedhf/trainer/hooks/clock.py."""

from .buffered import InFlight, next_arrivals, refill, staleness_weight
from .policy import RoundTiming, available_clients, client_seconds, deadline_round, wait_for_all
from .profile import ClientProfile, csv_profiles, lognormal_profiles

__all__ = ["ClientProfile", "InFlight", "RoundTiming", "available_clients", "client_seconds", "csv_profiles",
           "deadline_round", "lognormal_profiles", "next_arrivals", "refill", "staleness_weight", "wait_for_all"]
