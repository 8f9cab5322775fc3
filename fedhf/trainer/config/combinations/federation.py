"""Refused combinations of the federation's settings (each field's own value: config_checks.py), and the
evaluation that runs in one process."""

from __future__ import annotations

from typing import List

from .refusal import SETTINGS, Refusal

# the federation's settings among themselves (read when the config is made)
FIELDS: List[Refusal] = [
    Refusal(lambda s: s.args.clients_per_round > s.args.num_clients,
            lambda s: f"`clients_per_round`={s.args.clients_per_round} exceeds `num_clients`={s.args.num_clients}; "
                      "lower it or raise num_clients", needs=SETTINGS),
    Refusal(lambda s: (s.args.partition_key == "embedding") != (s.args.partition_encoder is not None),
            lambda s: "`partition_encoder` (a local sentence-encoder folder) is what `partition_key='embedding'` "
                      f"embeds with, and only that key uses it: got partition_key={s.args.partition_key!r}, "
                      f"partition_encoder={s.args.partition_encoder!r}", needs=SETTINGS),
    Refusal(lambda s: s.args.quantity_skew != 0 and s.args.partition == "natural",
            lambda s: "`quantity_skew` does not apply to `partition='natural'` (its sizes are the data's); set it to "
                      "0 or use 'iid'/'dirichlet'", needs=SETTINGS),
    Refusal(lambda s: s.args.personalized_eval and s.args.client_eval_fraction <= 0,
            lambda s: "`personalized_eval` evaluates each client on its held-out rows, but `client_eval_fraction` is "
                      "0: set client_eval_fraction (e.g. 0.1) or personalized_eval=False", needs=SETTINGS),
]

# the processes the run has (read when the trainer is built)
WITH_PROCESSES: List[Refusal] = [
    # personalised evaluation
    Refusal(lambda s: s.args.personalized_eval and s.world.size > 1,
            lambda s: f"`personalized_eval` runs in one process; this run has {s.world.size}",
            "launch one process or set personalized_eval=False"),
]
