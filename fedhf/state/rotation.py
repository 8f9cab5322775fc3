"""``save_total_limit`` over round checkpoints: keep the newest N ``checkpoint-round-*`` folders, and never the best
round's (as Trainer always retains the best checkpoint)."""

from __future__ import annotations

import os
import re
import shutil
from typing import List, Optional

from .checkpoint import PREFIX


def round_checkpoints(output_dir: str) -> List[int]:
    pattern = re.compile(re.escape(PREFIX) + r"(\d+)$")
    found = [pattern.match(name) for name in os.listdir(output_dir)] if os.path.isdir(output_dir) else []
    return sorted(int(m.group(1)) for m in found if m)


def rotate_checkpoints(output_dir: str, limit: Optional[int], best_round: Optional[int]) -> List[int]:
    """Delete the oldest checkpoints beyond ``limit`` (None or 0 = keep all), never ``best_round``'s.
    Returns the rounds deleted."""
    if not limit:
        return []
    rounds = round_checkpoints(output_dir)
    keep = set(rounds[-limit:]) | ({best_round} if best_round is not None else set())
    deleted = [r for r in rounds if r not in keep]
    for r in deleted:
        shutil.rmtree(os.path.join(output_dir, f"{PREFIX}{r}"))
    return deleted
