"""A FederatedConfig's split of a dataset: the key, the partitioner, quantity skew and held-out rows, in one place.

    key         = partition_key over partition_column (or a callable row -> key)      fedhf/data/keys.py
    partition   = iid | dirichlet(key, dirichlet_alpha) | natural(key)               fedhf/data/partition.py
                  with quantity_skew > 0: power-law sizes (iid or Dirichlet)         fedhf/data/quantity.py
    held-out    = client_eval_fraction of each client's rows                         fedhf/data/holdout.py
    report      = sizes, eval sizes, the key's name and counts per client x value    fedhf/data/report.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, List, Optional, Sequence

import numpy as np

from .holdout import hold_out
from .keys import Key, derive_key
from .partition import dirichlet_partition, iid_partition, natural_partition
from .quantity import power_law_sizes, sized_dirichlet_partition, sized_iid_partition
from .report import partition_report


@dataclass
class ClientSplit:
    """``train[i]``: row indices client i trains on; ``eval[i]``: its held-out rows (empty when
    ``client_eval_fraction`` is 0); ``report``: what partition.json records."""

    train: List[np.ndarray]
    eval: List[np.ndarray]
    report: dict


def split_dataset(dataset, args, key_fn: Optional[Callable[[dict], Hashable]] = None) -> ClientSplit:
    """Split ``dataset`` (a ``datasets.Dataset``) as ``args`` (a FederatedConfig) says."""
    key = _key(dataset, args, key_fn)
    n, clients = len(dataset), args.num_clients
    if args.partition == "natural":
        parts = natural_partition(key.codes, clients)
    elif args.partition == "iid" and args.quantity_skew > 0:
        parts = sized_iid_partition(power_law_sizes(n, clients, args.quantity_skew, args.min_partition_size), args.seed)
    elif args.partition == "iid":
        parts = iid_partition(n, clients, args.seed)
    elif args.quantity_skew > 0:
        sizes = power_law_sizes(n, clients, args.quantity_skew, args.min_partition_size)
        parts = sized_dirichlet_partition(key.codes, sizes, args.dirichlet_alpha, args.seed)
    else:
        parts = dirichlet_partition(key.codes, clients, args.dirichlet_alpha, args.seed, args.min_partition_size,
                                    args.partition_max_retries)
    return given_split(parts, args, key)


def given_split(parts: Sequence[np.ndarray], args, key: Optional[Key] = None) -> ClientSplit:
    """Hold out ``args.client_eval_fraction`` of each client's rows and build the report."""
    train, held = hold_out(parts, args.client_eval_fraction, args.seed)
    if key is None:
        report = {"num_clients": len(train), "sizes": [int(len(p)) for p in train]}
    else:
        report = {"key": key.name, **partition_report(train, key.codes, key.names)}
    if args.client_eval_fraction > 0:
        report.update(client_eval_fraction=args.client_eval_fraction, eval_sizes=[int(len(p)) for p in held])
    return ClientSplit(train, held, report)


def _key(dataset, args, key_fn) -> Optional[Key]:
    try:
        return derive_key(dataset, args.partition_key, args.partition_column, args.partition_key_buckets, key_fn,
                          args.partition_encoder, args.seed)
    except ValueError:
        if args.partition == "iid" and args.partition_key == "column" and key_fn is None:
            return None  # an IID split needs no key; the report shows label skew only when there is a column
        raise
