"""``save_total_limit`` over round checkpoints: keep the newest N ``checkpoint-N`` folders (older runs'
``checkpoint-round-N`` count too), and never the best round's (as Trainer always retains the best checkpoint)."""

from __future__ import annotations

import os
import shutil
from typing import List, Optional

from .checkpoint import round_folders


def round_checkpoints(output_dir: str) -> List[int]:
    return sorted({r for r, _ in round_folders(output_dir)})


def rotate_checkpoints(output_dir: str, limit: Optional[int], best_round: Optional[int]) -> List[int]:
    """Delete the oldest checkpoints beyond ``limit`` (None or 0 = keep all), never ``best_round``'s.
    Returns the rounds deleted."""
    if not limit:
        return []
    rounds = round_checkpoints(output_dir)
    keep = set(rounds[-limit:]) | ({best_round} if best_round is not None else set())
    deleted = [r for r in rounds if r not in keep]
    for r, name in round_folders(output_dir):
        if r in deleted:
            shutil.rmtree(os.path.join(output_dir, name))
    return deleted
