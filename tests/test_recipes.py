"""Every recipe parses into a FederatedConfig with no unknown keys; the quickstart example runs on a tiny budget."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
import torch
import yaml
from transformers import HfArgumentParser

from fedhf import FederatedConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_there_are_recipes():
    assert RECIPES


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_parses_with_no_unknown_keys(recipe, tmp_path):
    text = recipe.read_text()
    assert text.startswith("#") and "python " in text  # header: purpose and the exact command
    values = yaml.safe_load(text)
    values.update(output_dir=str(tmp_path), use_cpu=not torch.cuda.is_available())
    (config,) = HfArgumentParser(FederatedConfig).parse_dict(values, allow_extra_keys=False)
    config.build_algorithm()


def test_quickstart_runs_end_to_end_on_a_tiny_budget(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    sys.modules.pop("quickstart_tweets", None)
    import quickstart_tweets

    accuracy = quickstart_tweets.main([
        "--output_dir", str(tmp_path), "--num_rounds", "2", "--local_steps", "3", "--clients_per_round", "2",
        "--train_rows", "400", "--eval_rows", "100", "--min_partition_size", "5", "--disable_tqdm", "true"])
    history = json.loads((tmp_path / "federated_history.json").read_text())
    assert [h["round"] for h in history] == [0, 1, 2] and history[-1]["eval_accuracy"] == accuracy
    assert (tmp_path / "federated_history.png").exists()
    assert (tmp_path / "final" / "adapter_model.safetensors").exists()
