"""The ``embedding`` key: seeded k-means (exact on separated blobs; a Lloyd fixed point on real embeddings) over
MiniLM sentence embeddings of tweets with the label hidden, and a reproducible Dirichlet split over its clusters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhf.data import dirichlet_partition, split_dataset
from fedhf.data.embedding_key import embed_texts, kmeans

from tests.helpers import config


def _is_lloyd_fixed_point(points, assign, centers):
    points = points.double()
    assert torch.equal(torch.cdist(points, centers).argmin(1), assign)  # every point is at its nearest centroid
    for j in range(centers.shape[0]):
        assert torch.allclose(points[assign == j].mean(0), centers[j])  # every centroid is its points' mean


def test_kmeans_finds_separated_blobs_and_is_seeded():
    g = torch.Generator().manual_seed(0)
    truth = torch.arange(3).repeat_interleave(40)
    points = torch.randn(120, 5, generator=g) * 0.1 + 10.0 * torch.eye(5)[truth]
    assign, centers = kmeans(points, 3, seed=0)
    relabel = {int(t): int(a) for t, a in zip(truth, assign)}
    assert len(set(relabel.values())) == 3 and torch.equal(assign, torch.tensor([relabel[int(t)] for t in truth]))
    _is_lloyd_fixed_point(points, assign, centers)
    assert torch.equal(kmeans(points, 3, seed=0)[0], assign)


@pytest.fixture(scope="module")
def few_texts(tweet_texts):
    return tweet_texts.select(range(48))  # one encoder batch: the CPU forward is the slow part


def test_embedding_clusters_of_tweets_are_seeded_and_reproducible(few_texts, minilm, tmp_path):
    points = embed_texts(few_texts["text"], minilm)
    assert points.shape == (48, 384) and torch.allclose(points.norm(dim=1), torch.ones(48), atol=1e-5)
    assign, centers = kmeans(points, 4, seed=0)
    _is_lloyd_fixed_point(points, assign, centers)
    assert not torch.equal(kmeans(points, 4, seed=3)[0], assign)  # another seed starts elsewhere
    # the split embeds again (the encoder is deterministic) and clusters with the run's seed: the same clusters
    args = config(tmp_path, partition_key="embedding", partition_encoder=minilm, partition_column="text",
                  dirichlet_alpha=0.3, seed=0)
    split = split_dataset(few_texts, args)
    codes = np.unique(assign.numpy(), return_inverse=True)[1]
    expected = dirichlet_partition(codes, 4, 0.3, seed=0)
    assert all(np.array_equal(x, y) for x, y in zip(split.train, expected))
    assert split.report["key"].startswith("k-means cluster of `text` embeddings by ")
    assert split.report["key"].endswith("(4 clusters)") and split.report["classes"] == [f"cluster {i}" for i in range(4)]
    assert [sum(row) for row in split.report["counts"]] == [len(p) for p in split.train]
