"""Reading a partition column from a ``datasets.Dataset``, refusing columns that are not categorical."""

from __future__ import annotations

from typing import Optional, Tuple

import datasets

_CATEGORICAL_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "string",
                       "large_string"}


def categorical_column(dataset: datasets.Dataset, column: str, field: str) -> Tuple[list, Optional[list]]:
    """The column's values and, for a ClassLabel, its class names. ``field`` names the config field in errors."""
    if column not in dataset.column_names:
        raise ValueError(
            f"`{field}`={column!r} is not a column of the training dataset (columns: {dataset.column_names}). "
            "Set it to a categorical column, or use `partition='iid'` for data without one."
        )
    feature = dataset.features[column]
    if isinstance(feature, datasets.ClassLabel):
        return list(dataset[column]), list(feature.names)
    if isinstance(feature, datasets.Value) and feature.dtype in _CATEGORICAL_DTYPES:
        return list(dataset[column]), None
    raise ValueError(
        f"`{field}`={column!r} has type {feature!r}, which is not categorical. Use a ClassLabel, integer or string "
        f"column (e.g. `dataset.class_encode_column({column!r})` for strings), or `partition='iid'`."
    )
