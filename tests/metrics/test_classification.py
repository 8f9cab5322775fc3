"""The offline classification/GLUE metrics (fedhf.metrics.classification) against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedhf.metrics import classification

# predictions / references with TP = 3, FN = 2, FP = 1, TN = 4
PRED = [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
REF = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]


def test_binary_metrics_by_hand():
    assert classification.accuracy(PRED, REF) == 0.7
    assert classification.binary_f1(PRED, REF) == pytest.approx(2 * 3 / (2 * 3 + 1 + 2), abs=1e-15)  # P 3/4, R 3/5
    mcc = (3 * 4 - 1 * 2) / math.sqrt((3 + 1) * (3 + 2) * (4 + 1) * (4 + 2))  # (TP TN - FP FN) / sqrt(...)
    assert classification.matthews_corrcoef(PRED, REF) == pytest.approx(mcc, abs=1e-15)
    assert classification.matthews_corrcoef([1] * 10, REF) == 0.0  # constant prediction: undefined, 0 by convention
    assert classification.binary_f1([0, 0], [0, 0]) == 0.0


def test_multiclass_matthews_by_hand():
    # confusion (rows true, cols predicted) [[2,1,0],[0,2,1],[1,0,2]]: s 9, c 6, t = p = (3,3,3)
    ref = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    pred = [0, 0, 1, 1, 1, 2, 2, 2, 0]
    assert classification.matthews_corrcoef(pred, ref) == pytest.approx((6 * 9 - 27) / (81 - 27), abs=1e-15)


def test_correlations_by_hand():
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 1.0, 4.0, 3.0]
    # deviations (-1.5,-.5,.5,1.5) and (-.5,-1.5,1.5,.5): sum of products 3, each sum of squares 5
    assert classification.pearson(x, y) == pytest.approx(0.6, abs=1e-15)
    np.testing.assert_array_equal(classification.average_ranks([10, 20, 20, 5, 20]), [2, 4, 4, 1, 4])
    # ranks (1,2,3,4) vs (1,2.5,2.5,4): deviations (-1.5,-.5,.5,1.5), (-1.5,0,0,1.5): 4.5 / sqrt(5 * 4.5)
    assert classification.spearman(x, [1.0, 5.0, 5.0, 9.0]) == pytest.approx(math.sqrt(0.9), abs=1e-15)
    assert classification.spearman(x, [v ** 3 for v in x]) == pytest.approx(1.0, abs=1e-15)  # monotone


def test_compute_metrics_per_task():
    from transformers import EvalPrediction

    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 1.0], [1.0, 0.0]])
    labels = np.array([1, 0, 0, 0])
    assert classification.glue_compute_metrics("f1")(EvalPrediction(logits, labels)) == pytest.approx(
        {"accuracy": 0.75, "f1": 2 / 3})
    assert set(classification.glue_compute_metrics("matthews")(EvalPrediction(logits, labels))) == {"matthews_correlation"}
    scores = classification.glue_compute_metrics("correlation")(EvalPrediction(np.array([[1.0], [2.0], [3.0]]),
                                                                     np.array([1.5, 2.5, 3.0])))
    assert scores["spearmanr"] == pytest.approx(1.0) and 0.9 < scores["pearson"] < 1.0
