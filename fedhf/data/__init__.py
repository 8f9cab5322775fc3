"""Client data: partitioners over ``datasets.Dataset``, the keys they split by, and the partition report."""

from .columns import categorical_column
from .holdout import hold_out
from .keys import PARTITION_KEYS, Key, derive_key
from .partition import PARTITIONERS, dirichlet_partition, iid_partition, natural_partition
from .quantity import power_law_sizes, sized_dirichlet_partition, sized_iid_partition
from .report import label_skew, partition_counts, partition_report, save_partition_report
from .split import ClientSplit, given_split, split_dataset

__all__ = [
    "PARTITIONERS", "PARTITION_KEYS", "categorical_column", "dirichlet_partition", "iid_partition",
    "natural_partition", "label_skew", "partition_counts", "partition_report", "save_partition_report",
    "partition_dataset", "Key", "derive_key", "hold_out", "power_law_sizes", "sized_dirichlet_partition",
    "sized_iid_partition", "ClientSplit", "given_split", "split_dataset",
]


def partition_dataset(dataset, args, key_fn=None):
    """Split ``dataset`` as ``args`` (a FederatedConfig) says; returns (client training index arrays, report dict).
    ``split_dataset`` also returns each client's held-out rows."""
    split = split_dataset(dataset, args, key_fn)
    return split.train, split.report
