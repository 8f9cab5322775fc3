"""Client data: partitioners over ``datasets.Dataset`` and the partition report."""

from .columns import categorical_column
from .partition import PARTITIONERS, dirichlet_partition, iid_partition, natural_partition
from .report import label_skew, partition_counts, partition_report, save_partition_report

__all__ = [
    "PARTITIONERS", "categorical_column", "dirichlet_partition", "iid_partition", "natural_partition",
    "label_skew", "partition_counts", "partition_report", "save_partition_report", "partition_dataset",
]


def partition_dataset(dataset, args):
    """Split ``dataset`` as ``args`` (a FederatedConfig) says; returns (client index arrays, report dict)."""
    if args.partition == "iid":
        parts = iid_partition(len(dataset), args.num_clients, args.seed)
        try:  # the report shows label skew when there is a categorical column to show it for
            labels, names = categorical_column(dataset, args.partition_column, "partition_column")
        except ValueError:
            labels, names = None, None
    elif args.partition == "dirichlet":
        labels, names = categorical_column(dataset, args.partition_column, "partition_column")
        parts = dirichlet_partition(labels, args.num_clients, args.dirichlet_alpha, args.seed,
                                    args.min_partition_size, args.partition_max_retries)
    else:
        labels, names = categorical_column(dataset, args.partition_column, "partition_column")
        parts = natural_partition(labels, args.num_clients)
    return parts, partition_report(parts, labels, names)
