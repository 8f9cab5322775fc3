"""The data-split fields of :class:`fedhf.FederatedConfig`: how the training rows go to the clients
(fedhf/data/). Their values are checked with the federation's (``check_federation_fields`` in
fedhf/trainer/config/config_checks.py); the trainer splits the data in fedhf/trainer/runners/client_data.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...data import PARTITION_KEYS, PARTITIONERS
from .field_help import choice_list


@dataclass
class PartitionSettings:
    r"""
    The data split, a base of :class:`fedhf.FederatedConfig` (each parameter is its flag or recipe key).

    Parameters:
        partition (`str`, defaults to `"dirichlet"`): how rows go to clients.
        partition_column (`str`, defaults to `"label"`): the column a split by value reads.
        dirichlet_alpha (`float`, defaults to `0.5`): Dirichlet concentration (smaller is more skewed).
        min_partition_size (`int`, defaults to `1`): fewest rows any client may get.
        partition_max_retries (`int`, defaults to `100`): redraws of a Dirichlet split before an error.
        partition_key (`str`, defaults to `"column"`): what a split by value splits by.
        partition_key_buckets (`int`, defaults to `4`): quantile buckets or k-means clusters of the key.
        partition_encoder (`str`, *optional*): a local sentence encoder, for ``partition_key="embedding"``.
        quantity_skew (`float`, defaults to `0.0`): power-law client sizes; 0 = none.
        client_eval_fraction (`float`, defaults to `0.0`): each client's held-out share, never trained on.
        partition_report (`bool`, defaults to `True`): write partition.json and partition.png first.
    """

    partition: str = field(
        default="dirichlet", metadata={"help": f"How rows go to clients, one of: {choice_list(PARTITIONERS)}."})
    partition_column: str = field(
        default="label",
        metadata={"help": "Categorical column for 'dirichlet' (label skew) or 'natural' (one client per value)."})
    dirichlet_alpha: float = field(
        default=0.5, metadata={"help": "Dirichlet concentration: smaller is more skewed (0.1 strong, 100 ~ IID)."})
    min_partition_size: int = field(default=1, metadata={"help": "Fewest rows any client may get (dirichlet)."})
    partition_max_retries: int = field(
        default=100, metadata={"help": "Redraws of a Dirichlet split before giving up with an error."})
    partition_key: str = field(
        default="column",
        metadata={"help": f"What 'dirichlet'/'natural' split by, for data with or without labels, one of: "
                          f"{choice_list(PARTITION_KEYS)}. 'column' = the values of partition_column (a float column "
                          "in quantile buckets), 'length' = quantile bucket of the length of partition_column (text "
                          "or token ids), 'embedding' = k-means cluster of its text's sentence embedding "
                          "(partition_encoder). A callable row -> key: FederatedTrainer(partition_key=fn). See "
                          "fedhf/data/keys.py."})
    partition_key_buckets: int = field(
        default=4, metadata={"help": "Quantile buckets of a 'length' key or a float column (fewer when values tie); "
                                     "clusters of an 'embedding' key."})
    partition_encoder: Optional[str] = field(
        default=None,
        metadata={"help": "Local sentence-encoder folder for partition_key='embedding' (k-means over the embeddings "
                          "of partition_column's text, k = partition_key_buckets), e.g. the bundled MiniLM."})
    quantity_skew: float = field(
        default=0.0,
        metadata={"help": "Power-law client sizes: client i gets min_partition_size + a share of the rest in "
                          "proportion to (i+1)**-quantity_skew (0 = no quantity skew). With 'iid' or 'dirichlet'."})
    client_eval_fraction: float = field(
        default=0.0,
        metadata={"help": "Hold out this fraction of each client's rows (seeded, at least 1) as that client's own "
                          "evaluation set, never trained on: FederatedTrainer.client_eval_partitions."})
    partition_report: bool = field(
        default=True, metadata={"help": "Write partition.json and partition.png to output_dir before training (not "
                                        "under dp_mode: each client's sizes and label counts are not released)."})
