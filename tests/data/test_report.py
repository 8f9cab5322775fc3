"""The partition report with a class that has no rows (a ClassLabel class absent from the training split)."""

from __future__ import annotations

import json

import numpy as np

from fedhf.data import partition_report, save_partition_report


def test_a_class_with_no_rows_is_a_zero_column_and_the_plot_is_written(tmp_path):
    labels = [0, 0, 2, 2, 2, 0]  # class 1 ('b') has no rows
    parts = [np.array([0, 1, 2]), np.array([3, 4, 5])]
    report = partition_report(parts, labels, ["a", "b", "c"])
    assert report["classes"] == ["a", "b", "c"]
    assert report["counts"] == [[2, 0, 1], [1, 0, 2]]
    written = save_partition_report(report, str(tmp_path))
    assert json.loads((tmp_path / "partition.json").read_text())["counts"][0] == [2, 0, 1]
    assert any(p.endswith("partition.png") for p in written) and (tmp_path / "partition.png").stat().st_size > 0


def test_the_plot_labels_clients_with_whole_numbers_and_names_the_key(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    labels = [i % 3 for i in range(60)]
    parts = [np.arange(i * 3, i * 3 + 3) for i in range(20)]  # 20 clients: matplotlib would tick 0.0, 2.5, ...
    report = {**partition_report(parts, labels, ["a", "b", "c"]), "key": "`label`"}
    save_partition_report(report, str(tmp_path))
    heatmap, sizes = (next(ax for ax in figures[0].axes if ax.get_title().startswith(title))
                      for title in ("rows per client", "client sizes"))
    for ax in (heatmap, sizes):
        assert all(float(t).is_integer() for t in ax.get_yticks())
    assert heatmap.get_title().startswith("rows per client and label\n")
