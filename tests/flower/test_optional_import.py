"""fedhf.flower is an optional extra: without Flower its import names the extra to install."""

from __future__ import annotations

import importlib
import sys

import pytest


def test_without_flower_the_import_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr", None)  # `import flwr` raises ImportError (restored after the test)
    monkeypatch.delitem(sys.modules, "fedhf.flower", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'fedhf\[flower\]'"):
        importlib.import_module("fedhf.flower")
