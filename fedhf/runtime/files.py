"""File helpers shared by checkpoints and caches."""

from __future__ import annotations

import hashlib


def sha256_of(path: str) -> str:
    """The file's sha256 (hex), read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
