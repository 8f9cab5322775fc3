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
    "interactions": BELOW_THE_TRAINER | {"trainer"},  # the interaction matrix runs the trainer; nothing imports it
    "flower": BELOW_THE_TRAINER | {"trainer"},  # the Flower bridge (an optional extra) runs it; nothing imports it
}
TOP_LEVEL_MODULES = {"__init__", "__main__", "version", "cli", "recipes", "testing"}  # testing: checks for users' hooks


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


# ---------------------------------------------------------------------------------------------------- trainer/
# The trainer's sub-folders, by concept: what a config decides (config/), the round hooks (hooks/), how a round's
# clients are trained (runners/). Its top level holds the trainer classes and what they save and publish.
TRAINER = os.path.join(PACKAGE, "trainer")
TRAINER_TOP = {"__init__", "federated_trainer", "sft", "published", "hub", "every_row_evaluation", "late_metrics",
               "card_code", "card_details"}  # the trainer classes, their mixins, and the card they publish
# sub-folder -> the trainer folders it may import ("" is the top level); nothing below the runners imports them
TRAINER_RULES: Dict[str, Set[str]] = {
    "config": set(),  # what a config decides: nothing of the trainer (the refusal table is handed the trainer class)
    "hooks": {"config", ""},
    "runners": {"config", "hooks"},  # the trainer is passed in, never imported
    "": {"config", "hooks", "runners"},
}
# pure estimators and probes the trainer calls, kept below it: module -> its folder
BELOW_THE_TRAINER_MODULES = {"head_memory": "runtime", "secagg_check": "privacy", "server_needs": "server"}


def _python_files(folder: str) -> Set[str]:
    return {f[:-3] for f in os.listdir(folder) if f.endswith(".py")}


def _trainer_folder(name: str) -> str:
    """config/hooks/runners for ``fedhf.trainer.<folder>...``; "" for the trainer's top-level modules."""
    parts = name.split(".")
    return parts[2] if len(parts) > 3 and parts[2] in TRAINER_RULES else ""


def trainer_violations(trainer: str = TRAINER) -> List[str]:
    problems = []
    root = os.path.dirname(os.path.dirname(trainer))
    for directory, _, files in os.walk(trainer):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            is_package = name == "__init__.py"
            module = module[:-len(".__init__")] if is_package else module
            folder = _trainer_folder(module + (".__init__" if is_package else ""))
            for line, target in fedhf_imports(path, module, is_package):
                if not target.startswith("fedhf.trainer."):
                    continue
                target_folder = _trainer_folder(target)
                if target_folder != folder and target_folder not in TRAINER_RULES[folder]:
                    problems.append(f"{os.path.relpath(path, trainer)}:{line} imports {target}; trainer/"
                                    f"{folder or '.'} may import {sorted(TRAINER_RULES[folder])}")
    return problems


def test_the_trainer_top_level_holds_only_the_trainer_classes():
    assert _python_files(TRAINER) == TRAINER_TOP
    folders = {d for d in os.listdir(TRAINER) if os.path.isdir(os.path.join(TRAINER, d)) and d != "__pycache__"}
    assert folders == set(TRAINER_RULES) - {""}


def test_every_trainer_import_follows_its_sub_folders_rule():
    assert trainer_violations() == []


def test_a_broken_sub_folder_rule_is_caught(tmp_path):
    trainer = tmp_path / "fedhf" / "trainer"
    (trainer / "hooks").mkdir(parents=True)
    (trainer / "hooks" / "late.py").write_text("def f():\n    from ..runners.base import Runner\n")
    (trainer / "config" / "table").mkdir(parents=True)
    (trainer / "config" / "table" / "rows.py").write_text("from ...hooks.compression import compressed_model_change\n")
    found = sorted(trainer_violations(str(trainer)))
    assert found == [f"config{os.sep}table{os.sep}rows.py:1 imports fedhf.trainer.hooks.compression."
                     "compressed_model_change; trainer/config may import []",
                     f"hooks{os.sep}late.py:2 imports fedhf.trainer.runners.base.Runner; trainer/hooks may import "
                     "['', 'config']"]


def _classes(folder: str) -> Iterator[Tuple[str, ast.ClassDef]]:
    for name in sorted(_python_files(folder)):
        for node in ast.walk(ast.parse(open(os.path.join(folder, name + ".py")).read())):
            if isinstance(node, ast.ClassDef):
                yield name, node


def _base_names(node: ast.ClassDef) -> Set[str]:
    return {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}


def test_each_hooks_module_holds_a_round_hook():
    """hooks/ is the protocol (base, the hooks' checkpoint state in hook_state, the totals over processes a hook
    takes in process_totals), the run's list (round_features) and one module per round feature."""
    hooks = os.path.join(TRAINER, "hooks")
    with_a_hook = {name for name, node in _classes(hooks) if "RoundHook" in _base_names(node)} - {"base"}
    protocol = {"__init__", "base", "hook_state", "process_totals", "round_features"}
    assert with_a_hook and _python_files(hooks) - protocol == with_a_hook


def test_every_runner_is_in_runners():
    runners = {}
    for directory, _, files in os.walk(TRAINER):
        for name, node in _classes(directory):
            runners.update({node.name: os.path.relpath(directory, TRAINER)} if _base_names(node) &
                           {"Runner", "SequentialClients"} else {})
    assert runners and set(runners.values()) == {"runners"}, runners


def test_the_config_sub_folder_holds_every_settings_group_of_federated_config():
    """Each ``*_settings`` module of config/ declares a base of FederatedConfig, and every base fedhf declares is one."""
    from fedhf import FederatedConfig

    bases = {cls.__module__ for cls in FederatedConfig.__mro__[1:] if cls.__module__.startswith("fedhf.")}
    settings = {f"fedhf.trainer.config.{name}" for name in _python_files(os.path.join(TRAINER, "config"))
                if name.endswith("_settings")}
    assert bases == settings and settings


def test_the_pure_estimators_and_probes_live_below_the_trainer():
    for module, folder in BELOW_THE_TRAINER_MODULES.items():
        assert os.path.isfile(os.path.join(PACKAGE, folder, module + ".py")), (module, folder)
    for directory, _, files in os.walk(TRAINER):
        assert not {f[:-3] for f in files} & set(BELOW_THE_TRAINER_MODULES), directory


# ---------------------------------------------------------------------------------------------------- tests/
TESTS = os.path.dirname(os.path.abspath(__file__))
NOT_MIRRORED = {"fixtures", "end_to_end", "scripts", "pinned", "benchmarks"}  # by purpose, not by package folder
# test files named like a module of another folder, on purpose: path -> why
NAMED_APART = {"server/test_rules.py": "the server rules of every aggregator, not fedhf/sync/rules.py"}


def mirror_violations(tests: str = TESTS, package: str = PACKAGE) -> List[str]:
    """Each test folder is a package folder; a test_<m>.py sits in the folder of fedhf's module <m>."""
    homes: Dict[str, Set[str]] = {}
    for directory, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py") and name != "__init__.py":
                homes.setdefault(name[:-3], set()).add(os.path.relpath(directory, package))
    problems = []
    for directory, dirs, files in os.walk(tests):
        rel = os.path.relpath(directory, tests)
        dirs[:] = [d for d in dirs if d != "__pycache__" and (rel != "." or d not in NOT_MIRRORED)]
        if rel != "." and not os.path.isdir(os.path.join(package, rel)):
            problems.append(f"tests/{rel}/ mirrors no fedhf folder")
        for name in files:
            module = name[len("test_"):-len(".py")] if name.startswith("test_") and name.endswith(".py") else None
            path = os.path.normpath(os.path.join(rel, name)).replace(os.sep, "/")
            if module in homes and rel not in homes[module] and path not in NAMED_APART:
                problems.append(f"tests/{path} tests fedhf/{sorted(homes[module])[0]}/{module}.py")
    return problems


def test_tests_mirror_the_package():
    assert mirror_violations() == []


def test_a_test_out_of_its_mirror_is_caught(tmp_path):
    (tmp_path / "fedhf" / "trainer" / "hooks").mkdir(parents=True)
    (tmp_path / "fedhf" / "trainer" / "hooks" / "tick.py").write_text("")
    (tmp_path / "tests" / "trainer" / "nowhere").mkdir(parents=True)
    (tmp_path / "tests" / "trainer" / "test_tick.py").write_text("")
    found = mirror_violations(str(tmp_path / "tests"), str(tmp_path / "fedhf"))
    assert sorted(found) == ["tests/trainer/nowhere/ mirrors no fedhf folder",
                             "tests/trainer/test_tick.py tests fedhf/trainer/hooks/tick.py"]
