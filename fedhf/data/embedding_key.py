"""The ``embedding`` split key: k-means clusters of sentence embeddings of a text column.

Rows are embedded with a local sentence encoder (``partition_encoder``: a transformers model folder, e.g. the
bundled MiniLM, ``fedhf.data.demo.minilm_path()``) by attention-masked mean pooling of the last hidden state and L2
normalisation (Reimers & Gurevych, "Sentence-BERT", EMNLP 2019), then clustered by k-means (Lloyd, 1982) with
k-means++ seeding (Arthur & Vassilvitskii, SODA 2007) from a seeded ``torch.Generator``: the same seed gives the
same clusters. A Dirichlet split over the clusters gives clients different topics of an unlabelled corpus (the
"semantic" non-IID split of FedLLM-Bench-style instruction data). Runs once per run, before training.
"""

from __future__ import annotations

import os
from typing import List, Sequence, Tuple

import torch


def check_encoder(path: str) -> None:
    """Before any work: the encoder must be a local folder (no download happens while a split is made)."""
    if not os.path.isdir(path):
        raise ValueError(
            f"`partition_encoder`={path!r} is not a local model folder. Give the folder of a sentence encoder "
            "(e.g. fedhf.data.demo.minilm_path(), or a snapshot_download() of one); it is loaded offline."
        )


@torch.no_grad()
def embed_texts(texts: Sequence[str], encoder: str, batch_size: int = 64, max_length: int = 128) -> torch.Tensor:
    """(rows, hidden) L2-normalised mean-pooled embeddings, float32 on the CPU."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(encoder, local_files_only=True)
    model = AutoModel.from_pretrained(encoder, local_files_only=True).eval()
    out = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(list(texts[start:start + batch_size]), padding=True, truncation=True,
                          max_length=max_length, return_tensors="pt")
        hidden = model(**batch).last_hidden_state.float()
        mask = batch["attention_mask"].unsqueeze(-1).float()
        out.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0), dim=-1))
    return torch.cat(out)


def kmeans(points: torch.Tensor, k: int, seed: int, max_iters: int = 100) -> Tuple[torch.Tensor, torch.Tensor]:
    """(assignment of each point, centroids): k-means++ seeding, then Lloyd steps until no centroid moves.
    A centroid that loses all its points stays where it was."""
    points = points.double()
    generator = torch.Generator().manual_seed(seed)
    n = points.shape[0]
    k = min(k, n)
    first = int(torch.randint(n, (1,), generator=generator))
    centroids = [points[first]]
    nearest = ((points - points[first]) ** 2).sum(1)
    for _ in range(1, k):
        if nearest.sum() > 0:  # the next centroid: a point drawn with probability proportional to D(x)^2
            pick = int(torch.multinomial(nearest / nearest.sum(), 1, generator=generator))
        else:  # every point coincides with a centroid already
            pick = int(torch.randint(n, (1,), generator=generator))
        centroids.append(points[pick])
        nearest = torch.minimum(nearest, ((points - points[pick]) ** 2).sum(1))
    centers = torch.stack(centroids)
    assign = torch.cdist(points, centers).argmin(1)
    for _ in range(max_iters):
        moved = torch.stack([points[assign == j].mean(0) if (assign == j).any() else centers[j] for j in range(k)])
        if torch.equal(moved, centers):
            break
        centers = moved
        assign = torch.cdist(points, centers).argmin(1)
    return assign, centers


def embedding_clusters(texts: Sequence[str], encoder: str, k: int, seed: int) -> List[int]:
    """Cluster id of every text: k-means over the texts' sentence embeddings."""
    return kmeans(embed_texts(texts, encoder), k, seed)[0].tolist()
