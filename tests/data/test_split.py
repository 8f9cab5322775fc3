"""A FederatedConfig's split of data without labels: the derived-key Dirichlet split is seeded and reaches the
asked skew on the tweets with the label hidden; quantity skew and held-out rows compose with it; the trainer keeps
each client's held-out rows and takes a callable key."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedhf.data import derive_key, label_skew, power_law_sizes, save_partition_report, split_dataset

from tests.helpers import config, digit_trainer, tiny_resnet


def _length_split(tmp_path, dataset, **kw):
    base = dict(partition="dirichlet", partition_key="length", partition_column="text", num_clients=10,
                clients_per_round=10)
    return split_dataset(dataset, config(tmp_path, **{**base, **kw}))


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def test_length_key_dirichlet_split_is_seeded(tmp_path, tweet_texts):
    a = _length_split(tmp_path, tweet_texts, dirichlet_alpha=0.3, seed=4)
    b = _length_split(tmp_path, tweet_texts, dirichlet_alpha=0.3, seed=4)
    c = _length_split(tmp_path, tweet_texts, dirichlet_alpha=0.3, seed=5)
    assert _same(a.train, b.train) and not _same(a.train, c.train)
    assert np.array_equal(np.sort(np.concatenate(a.train)), np.arange(len(tweet_texts)))


def test_length_key_skew_grows_as_alpha_shrinks_with_the_label_hidden(tmp_path, tweet_texts):
    assert "label" not in tweet_texts.column_names
    codes = derive_key(tweet_texts, "length", "text", 4).codes
    skew = {}
    for alpha in (0.1, 1.0, 100.0):
        splits = [_length_split(tmp_path, tweet_texts, dirichlet_alpha=alpha, seed=s) for s in range(3)]
        # the report's skew is the mean total-variation distance of each client's length-bucket mix to the global
        assert all(s.report["label_skew"] == pytest.approx(label_skew(s.train, codes)) for s in splits)
        skew[alpha] = np.mean([s.report["label_skew"] for s in splits])
    assert skew[0.1] > skew[1.0] > skew[100.0]
    assert skew[0.1] > 0.4 and skew[100.0] < 0.1


def test_the_report_names_the_key_and_counts_each_client_per_value(tmp_path, tweet_texts):
    split = _length_split(tmp_path, tweet_texts, dirichlet_alpha=0.5, client_eval_fraction=0.1)
    report = split.report
    assert report["key"] == "length of `text` in characters (4 quantile buckets)"
    assert report["classes"] == derive_key(tweet_texts, "length", "text", 4).names
    assert [sum(row) for row in report["counts"]] == report["sizes"] == [len(p) for p in split.train]
    assert report["eval_sizes"] == [len(p) for p in split.eval] and report["client_eval_fraction"] == 0.1
    written = save_partition_report(report, str(tmp_path / "report"))
    assert json.loads((tmp_path / "report" / "partition.json").read_text())["key"] == report["key"]
    assert written[-1].endswith("partition.png")


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_quantity_skew_gives_the_power_law_sizes_with_and_without_held_out_rows(tmp_path, tweet_texts, partition):
    n = len(tweet_texts)
    sizes = power_law_sizes(n, 10, 1.0, 20).tolist()
    split = _length_split(tmp_path, tweet_texts, partition=partition, quantity_skew=1.0, min_partition_size=20)
    assert [len(p) for p in split.train] == sizes and sum(sizes) == n and min(sizes) >= 20
    held = _length_split(tmp_path, tweet_texts, partition=partition, quantity_skew=1.0, min_partition_size=20,
                         client_eval_fraction=0.25)
    for whole, train, evaluation in zip(split.train, held.train, held.eval):
        assert len(evaluation) == round(0.25 * len(whole)) and np.intersect1d(train, evaluation).size == 0
        assert np.array_equal(np.sort(np.concatenate([train, evaluation])), whole)  # same split, rows set apart


def test_iid_over_data_without_a_label_column_needs_no_key(tmp_path, tweet_texts):
    split = split_dataset(tweet_texts, config(tmp_path, partition="iid"))
    assert "key" not in split.report and split.report["sizes"] == [750] * 4


def test_the_trainer_keeps_held_out_rows_apart_and_takes_a_callable_key(tmp_path, digits):
    def parity(row):
        return row["label"] % 2

    args = config(tmp_path, partition="natural", num_clients=2, clients_per_round=2, client_eval_fraction=0.2)
    trainer = digit_trainer(tiny_resnet(), digits, args, partition_key=parity)
    labels = np.asarray(digits["train"]["label"])
    for value, (train, held) in enumerate(zip(trainer.client_partitions, trainer.client_eval_partitions)):
        assert np.all(labels[train] % 2 == value) and np.all(labels[held] % 2 == value)
        assert len(held) == round(0.2 * (len(train) + len(held))) and np.intersect1d(train, held).size == 0
    assert trainer.partition_summary["key"] == "parity(row)"
    assert trainer.partition_summary["eval_sizes"] == [len(h) for h in trainer.client_eval_partitions]
