"""Instruction-like data without labels: 3,000 real tweets with the label column removed."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tweet_texts():
    from fedhf.data.demo import load_tweets, subsample

    return subsample(load_tweets()["train"], 3000, seed=0).remove_columns("label")
