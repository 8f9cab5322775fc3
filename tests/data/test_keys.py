"""Keys a split runs over: a column as is, a float column or a text/token length in quantile buckets, a callable."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from fedhf.data import derive_key, dirichlet_partition
from fedhf.data.keys import quantile_buckets


def test_length_key_cuts_the_text_lengths_into_ordered_equal_count_buckets(tweet_texts):
    key = derive_key(tweet_texts, "length", "text", 4)
    lengths = np.array([len(t) for t in tweet_texts["text"]])
    assert key.name == "length of `text` in characters (4 quantile buckets)"
    assert len(key.names) == 4 and set(np.unique(key.codes)) == {0, 1, 2, 3}
    for b in range(3):  # every length in bucket b is below every length in bucket b + 1
        assert lengths[key.codes == b].max() < lengths[key.codes == b + 1].min()
    counts = np.bincount(key.codes)
    assert abs(counts - len(lengths) / 4).max() < 0.05 * len(lengths)  # equal counts up to ties
    lo, hi = key.names[0].split("-")
    assert (int(lo), int(hi)) == (lengths[key.codes == 0].min(), lengths[key.codes == 0].max())


def test_length_of_token_ids_counts_tokens(tweets):
    key = derive_key(tweets["train"], "length", "input_ids", 3)
    lengths = np.array([len(ids) for ids in tweets["train"]["input_ids"]])
    assert "in tokens" in key.name
    assert all(lengths[key.codes == b].max() < lengths[key.codes == b + 1].min() for b in range(len(key.names) - 1))


def test_ties_drop_empty_buckets():
    codes, names = quantile_buckets([1, 1, 1, 1, 1, 1, 2, 3], 4)
    assert names == ["1-1", "2-3"]
    assert codes.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]


def test_column_key_keeps_labels_and_gives_the_same_split_as_the_raw_values(tweets):
    labels = np.asarray(tweets["train"]["label"])
    key = derive_key(tweets["train"], "column", "label", 4)
    assert key.names == ["negative", "neutral", "positive"] and np.array_equal(key.codes, labels)
    words = np.array(["neg", "neu", "pos"])[labels]  # a string column: codes in sorted value order
    text_key = derive_key(datasets.Dataset.from_dict({"mood": words.tolist()}), "column", "mood", 4)
    assert text_key.names == ["neg", "neu", "pos"]
    a = dirichlet_partition(words, 6, 0.3, seed=3)
    b = dirichlet_partition(text_key.codes, 6, 0.3, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_float_column_is_bucketed():
    data = datasets.Dataset.from_dict({"score": np.linspace(0.0, 1.0, 100).tolist()})
    key = derive_key(data, "column", "score", 5)
    assert np.bincount(key.codes).tolist() == [20] * 5 and key.name == "`score` (5 quantile buckets)"


def test_callable_key_over_rows(tweet_texts):
    def exclaims(row):
        return "!" in row["text"]

    key = derive_key(tweet_texts, "column", "ignored", 4, key_fn=exclaims)
    assert key.name == "exclaims(row)" and key.names == ["False", "True"]
    assert key.codes.tolist() == [int("!" in t) for t in tweet_texts["text"]]


def test_length_of_a_number_column_is_refused_naming_the_column(tweets):
    with pytest.raises(ValueError, match="text or token-id list.*`partition_column`='label' holds int"):
        derive_key(tweets["train"], "length", "label", 4)
    with pytest.raises(ValueError, match="`partition_column`='prompt' is not a column"):
        derive_key(tweets["train"], "length", "prompt", 4)
