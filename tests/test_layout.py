"""The package's folders and their import rules (docs/architecture.md), checked by reading every import.

Each folder of ``fedhf`` may import only the folders its rule names; ``version.py`` imports nothing and may be
imported by anyone. A rule broken anywhere (a module-level import or one inside a function) fails here with the
importing file, the line and the rule.
"""

from __future__ import annotations

import ast
import os
from typing import Dict, Iterator, List, Set, Tuple

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fedhf")
AXES = {"optim", "sync", "corrections", "server", "sharing"}
BELOW_THE_TRAINER = {"core", "runtime", *AXES, "algorithms", "data", "metrics", "state", "compression", "privacy",
                     "simulation"}
# folder -> the folders it may import (besides itself and version.py)
RULES: Dict[str, Set[str]] = {
    "core": set(),  # the round's vocabulary: nothing else of fedhf
    "runtime": {"core"},  # model and machine helpers, below the axes
    **{axis: {"core", "runtime"} for axis in AXES},  # no axis imports another
    "state": {"core", "runtime"},
    "privacy": {"core", "runtime"},  # clipping, the accountant, secure aggregation's numerics
    "simulation": set(),  # simulated time: device profiles and round policies, pure
    "metrics": {"core", "runtime"},
    "compression": {"core", "runtime"},  # compressors and error feedback, applied by the trainer's round hook
    "data": {"core", "runtime", "metrics"},
    "algorithms": {"core", "runtime", *AXES},  # named compositions of the axes
    "trainer": BELOW_THE_TRAINER,  # nothing below imports the trainer
    "": BELOW_THE_TRAINER | {"trainer"},  # the package's top: __init__, cli, recipes
}
TOP_LEVEL_MODULES = {"__init__", "__main__", "version", "cli", "recipes"}


def _modules() -> Iterator[Tuple[str, str, bool]]:
    """(path, module name, is a package's __init__) of every file of the package."""
    root = os.path.dirname(PACKAGE)
    for directory, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                is_package = name == "__init__.py"
                yield path, module[:-len(".__init__")] if is_package else module, is_package


def fedhf_imports(path: str, module: str, is_package: bool) -> List[Tuple[int, str]]:
    """(line, absolute name) of every import of fedhf in a file, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                target = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if target == "fedhf" or target.startswith("fedhf."):
                found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "fedhf"]
    return found


def folder_of(name: str) -> str:
    """The folder of ``fedhf.<folder>...``; "" for the package's top-level modules."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and os.path.isdir(os.path.join(PACKAGE, parts[1])) else ""


def violations() -> List[str]:
    problems = []
    for path, module, is_package in _modules():
        folder = folder_of(module) if (is_package or module.count(".") > 1) else ""
        for line, target in fedhf_imports(path, module, is_package):
            target_folder = folder_of(target)
            if target.startswith("fedhf.version") or target_folder == folder:
                continue
            if target_folder not in RULES[folder]:
                rule = ", ".join(sorted(RULES[folder])) or "nothing else of fedhf"
                problems.append(f"{os.path.relpath(path, PACKAGE)}:{line} imports {target}; "
                                f"fedhf/{folder or '.'} may import {rule}")
    return problems


def test_every_import_follows_its_folders_rule():
    assert violations() == []


def test_a_broken_rule_is_caught(tmp_path, monkeypatch):
    """The checker itself: an axis importing another axis, and the vocabulary importing the trainer, are found."""
    fake = tmp_path / "fedhf"
    (fake / "sync").mkdir(parents=True)
    (fake / "core").mkdir()
    (fake / "sync" / "rules.py").write_text("from ..corrections.base import Correction\n")
    (fake / "core" / "context.py").write_text("def f():\n    from fedhf.trainer import FederatedTrainer\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", str(fake))
    found = violations()
    assert len(found) == 2
    assert any("sync/rules.py:1 imports fedhf.corrections.base" in p for p in found)
    assert any("core/context.py:2 imports fedhf.trainer" in p and "nothing else of fedhf" in p for p in found)


def test_every_folder_has_a_rule_and_the_top_level_is_small():
    folders = {d for d in os.listdir(PACKAGE) if os.path.isdir(os.path.join(PACKAGE, d)) and d != "__pycache__"}
    assert folders == set(RULES) - {""}
    top = {f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py")}
    assert top == TOP_LEVEL_MODULES
