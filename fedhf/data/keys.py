"""The key a split is drawn over: one discrete value per row, for data with or without a label column.

Instruction data has no label to skew, so the Dirichlet split (Hsu et al., 2019) and the natural split run over a
key derived from each row instead (the label-free non-IID splits of FedLLM-Bench, Ye et al., 2024, and OpenFedLLM,
Ye et al., 2024, use task/category columns or lengths):

* ``column``: the values of ``partition_column``; a categorical column (ClassLabel, integer, string, bool) as is,
  a float column cut into ``partition_key_buckets`` quantile buckets.
* ``length``: the quantile bucket of the length of ``partition_column``: characters of a text, or tokens of a
  token-id list (``input_ids``).
* ``embedding``: the k-means cluster (k = ``partition_key_buckets``, seeded by ``seed``) of the sentence embedding
  of the text in ``partition_column``, by the local encoder ``partition_encoder`` (fedhf/data/embedding_key.py).
* any callable ``row -> hashable`` (Python API only: ``FederatedTrainer(partition_key=fn)`` or
  ``fedhf.data.split_dataset(dataset, args, key_fn=fn)``), e.g. ``lambda row: row["category"]``.

A key is stored as integer codes 0..K-1 in sorted value order plus the K names, so the partitioners draw exactly
what they drew from the raw label values before (np.unique orders both the same way).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Hashable, List, Optional, Sequence

import datasets
import numpy as np

from .columns import categorical_column

PARTITION_KEYS = ("column", "length", "embedding")
_FLOAT_DTYPES = {"float16", "float32", "float64", "bfloat16"}


@dataclass
class Key:
    """``codes[r]`` in 0..K-1 is row r's key value, named ``names[codes[r]]``; ``name`` says what the key is."""

    name: str
    codes: np.ndarray
    names: List[str]


def derive_key(dataset: datasets.Dataset, key: str, column: str, buckets: int,
               key_fn: Optional[Callable[[dict], Hashable]] = None, encoder: Optional[str] = None,
               seed: int = 0) -> Key:
    """The key of every row of ``dataset``: ``key_fn`` when given, else the named ``key`` over ``column``
    (``encoder`` and ``seed``: the ``embedding`` key's sentence encoder folder and k-means seed)."""
    if key_fn is not None:
        return callable_key(dataset, key_fn)
    if key == "embedding":
        return embedding_key(dataset, column, buckets, encoder, seed)
    if key == "length":
        return length_key(dataset, column, buckets)
    return column_key(dataset, column, buckets)


def column_key(dataset: datasets.Dataset, column: str, buckets: int) -> Key:
    if column in dataset.column_names:
        feature = dataset.features[column]
        if isinstance(feature, datasets.Value) and feature.dtype in _FLOAT_DTYPES:
            codes, names = quantile_buckets(np.asarray(dataset[column], dtype=float), buckets)
            return Key(f"`{column}` ({len(names)} quantile buckets)", codes, names)
    values, class_names = categorical_column(dataset, column, "partition_column")
    if class_names:  # a ClassLabel: its classes are 0..len(names)-1, rows or not (a class may have no rows)
        return Key(f"`{column}`", np.asarray(values, dtype=np.int64), list(class_names))
    distinct, codes = np.unique(np.asarray(values), return_inverse=True)
    return Key(f"`{column}`", codes.astype(np.int64), [str(v) for v in distinct])


def length_key(dataset: datasets.Dataset, column: str, buckets: int) -> Key:
    if column not in dataset.column_names:
        raise ValueError(
            f"`partition_column`={column!r} is not a column of the training dataset (columns: "
            f"{dataset.column_names}); `partition_key='length'` needs the text or token-id column to measure."
        )
    lengths = []
    for value in dataset[column]:
        if not isinstance(value, (str, list, tuple, np.ndarray)):
            raise ValueError(
                f"`partition_key='length'` measures a text or token-id list, but `partition_column`={column!r} "
                f"holds {type(value).__name__} values; name a text column (e.g. 'text') or 'input_ids'."
            )
        lengths.append(len(value))
    codes, names = quantile_buckets(np.asarray(lengths, dtype=float), buckets)
    unit = "characters" if isinstance(dataset[0][column], str) else "tokens"
    return Key(f"length of `{column}` in {unit} ({len(names)} quantile buckets)", codes, names)


def embedding_key(dataset: datasets.Dataset, column: str, clusters: int, encoder: str, seed: int) -> Key:
    from .embedding_key import embedding_clusters

    texts = _text_column(dataset, column, "embedding")
    distinct, codes = np.unique(embedding_clusters(texts, encoder, clusters, seed), return_inverse=True)
    return Key(f"k-means cluster of `{column}` embeddings by {os.path.basename(os.path.normpath(encoder))} "
               f"({len(distinct)} clusters)", codes.astype(np.int64), [f"cluster {i}" for i in range(len(distinct))])


def _text_column(dataset: datasets.Dataset, column: str, key: str) -> list:
    if column not in dataset.column_names:
        raise ValueError(f"`partition_column`={column!r} is not a column of the training dataset (columns: "
                         f"{dataset.column_names}); `partition_key={key!r}` needs the text column to embed.")
    texts = dataset[column]
    if not all(isinstance(t, str) for t in texts):
        raise ValueError(f"`partition_key={key!r}` embeds text, but `partition_column`={column!r} holds other values; "
                         "name a text column (e.g. 'text').")
    return texts


def callable_key(dataset: datasets.Dataset, key_fn: Callable[[dict], Hashable]) -> Key:
    values = [key_fn(row) for row in dataset]
    try:
        distinct = sorted(set(values))
    except TypeError:  # values that do not order (mixed types): first appearance, still deterministic
        distinct = list(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(distinct)}
    name = getattr(key_fn, "__name__", type(key_fn).__name__)
    return Key(f"{name}(row)", np.asarray([index[v] for v in values], dtype=np.int64), [str(v) for v in distinct])


def quantile_buckets(values: Sequence[float], buckets: int) -> tuple:
    """Codes of ``buckets`` quantile buckets of ``values`` (equal-count up to ties) and names 'lo-hi' of the
    values each holds. Ties can leave a bucket empty; empty buckets are dropped, so there may be fewer."""
    values = np.asarray(values, dtype=float)
    edges = np.quantile(values, np.linspace(0, 1, buckets + 1)[1:-1])
    raw = np.searchsorted(edges, values, side="right")
    present, codes = np.unique(raw, return_inverse=True)
    names = [f"{_num(values[raw == b].min())}-{_num(values[raw == b].max())}" for b in present]
    return codes.astype(np.int64), names


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.3g}"
