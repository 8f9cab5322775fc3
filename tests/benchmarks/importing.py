"""The benchmark scripts as modules: benchmarks/ imports its helpers by bare name, so it is on sys.path while they import."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def import_benchmark(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ on sys.path only while it and its helpers import)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
