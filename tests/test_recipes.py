"""Every recipe is a sectioned recipe with no unknown key in any section, whose train: section parses into a
FederatedConfig on this machine (bf16 included); bad recipes fail naming the key before any work; the quickstart
example runs on a tiny budget."""

from __future__ import annotations

import json
import math
import pathlib
import sys
import warnings

import pytest
import torch
import yaml
from peft import LoraConfig
from transformers import HfArgumentParser

from fedhf import FederatedConfig
from fedhf.recipes import TASKS, load_recipe

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
TWEETS = ROOT / "recipes" / "tweets_minilm_lora_scaffold_dir0.3_n12.yaml"
LLM = ROOT / "recipes" / "tweets_tinyllama_sft_fedmuon_dir0.5_n8.yaml"


def test_there_are_recipes():
    assert RECIPES


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_parses_with_no_unknown_keys(recipe, tmp_path):
    text = recipe.read_text()
    assert text.startswith("#") and f"fedhf train --config recipes/{recipe.name}" in text  # header: the command
    loaded = load_recipe(str(recipe))  # refuses an unknown section or key in model/lora/data/train
    assert loaded.model.task in TASKS
    if loaded.lora is not None:
        LoraConfig(**loaded.lora)
    train = dict(loaded.train, output_dir=str(tmp_path))  # no use_cpu: bf16 must parse as is (`auto` resolved)
    (config,) = HfArgumentParser(FederatedConfig).parse_dict(train, allow_extra_keys=False)
    config.build_algorithm()
    if config.bf16 and not torch.accelerator.is_available():
        assert config.use_cpu  # FederatedConfig's answer to bf16 on a CPU-only machine


def _write(tmp_path, values, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _tweets():
    return yaml.safe_load(TWEETS.read_text())


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update(optim={}), r"unknown section\(s\) \['optim'\]"),
    (lambda r: r.pop("data"), r"missing section\(s\) \['data'\]"),
    (lambda r: r["model"].update(num_label=3), r"\['num_label'\] in section `model:`"),
    (lambda r: r["data"].update(rows=10), r"\['rows'\] in section `data:`"),
    (lambda r: r["lora"].update(rank=8), r"\['rank'\] in section `lora:`.*LoraConfig"),
    (lambda r: r["train"].update(num_client=3), r"\['num_client'\] in section `train:`.*FederatedConfig"),
    (lambda r: r["model"].update(task="speech-recognition"), r"unknown `model.task` 'speech-recognition'.*causal-lm"),
    (lambda r: r["model"].update(tokenizer="bundled-minilm"), r"`model.tokenizer`.*are for `model.task: causal-lm`"),
    (lambda r: r["data"].update(generation_rows=5), r"`data.generation_rows` are for `model.task: causal-lm`"),
    (lambda r: r["model"].update(task="causal-lm", name_or_path=None, config={"model_type": "llama"}),
     r"built from `model.config` needs `model.tokenizer`"),
    (lambda r: r["model"].update(task="causal-lm", tokenizer="bundled-bert"),
     r"bundled model 'bundled-bert' in `model.tokenizer`"),
    (lambda r: r["model"].update(name_or_path="bundled-bert"), r"bundled model 'bundled-bert'.*bundled-minilm"),
    (lambda r: r["data"].update(dataset="bundled-imdb"), r"bundled dataset 'bundled-imdb'.*bundled-tweets"),
    (lambda r: r["data"].update(dataset="./no/such.csv"), r"`data.dataset` './no/such.csv' does not exist"),
    (lambda r: r["model"].update(config={"model_type": "resnet"}), r"exactly one of `model.name_or_path`"),
])
def test_bad_recipe_fails_naming_the_key(tmp_path, edit, message):
    values = _tweets()
    edit(values)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_recipe(_write(tmp_path, values))


def test_missing_recipe_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such.yaml"):
        load_recipe(str(tmp_path / "no_such.yaml"))


@pytest.mark.parametrize("section, key, name, flag", [
    ("model", "name_or_path", "someone/uncached-model-xyz", "HF_HUB_OFFLINE"),
    ("data", "dataset", "someone/uncached-dataset-xyz", "HF_HUB_OFFLINE"),
])
def test_hub_name_while_offline_fails_naming_the_setting(tmp_path, monkeypatch, section, key, name, flag):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    values = _tweets()
    values[section][key] = name
    with pytest.raises(ValueError, match=f"{name}.*{flag}=1"):
        load_recipe(_write(tmp_path, values))


def test_quickstart_runs_end_to_end_on_a_tiny_budget(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    sys.modules.pop("quickstart_tweets", None)
    import quickstart_tweets

    accuracy = quickstart_tweets.main([
        "--output_dir", str(tmp_path), "--num_rounds", "2", "--local_steps", "3", "--clients_per_round", "2",
        "--train_rows", "400", "--eval_rows", "100", "--min_partition_size", "5", "--disable_tqdm", "true",
        "--bf16", "false"])  # bf16 matmuls are emulated (~500x slower) on CPUs without AVX-512 BF16/AMX
    history = json.loads((tmp_path / "federated_history.json").read_text())
    assert [h["round"] for h in history] == [0, 1, 2] and history[-1]["eval_accuracy"] == accuracy
    assert (tmp_path / "federated_history.png").exists()
    assert (tmp_path / "final" / "adapter_model.safetensors").exists()


def test_causal_lm_recipe_runs_end_to_end_on_a_tiny_budget(tmp_path):
    """The LLM recipe through the command (its data shrunk): SFT loss falls, perplexity is exp(eval loss), the
    generation accuracy over held-out prompts is reported, and the full model is saved."""
    from fedhf.cli import train

    values = yaml.safe_load(LLM.read_text())
    values["data"].update(train_rows=200, eval_rows=16, generation_rows=16)
    last = train(_write(tmp_path, values), ["--output_dir", str(tmp_path / "out"), "--num_rounds", "2",
                                            "--local_steps", "3", "--eval_every_rounds", "1"])
    history = json.loads((tmp_path / "out" / "federated_history.json").read_text())
    evaluated = [h for h in history if "eval_loss" in h]
    assert [h["round"] for h in evaluated] == [0, 1, 2] and last == history[-1]
    assert evaluated[-1]["eval_loss"] < evaluated[0]["eval_loss"] - 1.0  # from ~ln(30522) = 10.3
    for h in evaluated:
        assert h["eval_perplexity"] == pytest.approx(math.exp(h["eval_loss"]), rel=1e-9)
        assert 0.0 <= h["eval_generation_accuracy"] <= 1.0
    assert (tmp_path / "out" / "final" / "model.safetensors").exists()


# Named algorithms never set clipping: `max_grad_norm` is the Trainer's one setting for it (default 1.0) under every
# algorithm (docs/configuration.md, clipping). A paper's own clipping lives in its recipe, pinned here with its source.
PAPER_CLIPPING = {
    "fedpm_table3_digits_convnext_dir0.1_n10.yaml": 0.0,  # FedPM Table 4: none
    "fedpac_table1_digits_convnext_dir0.1_n100.yaml": 10.0,  # not in the paper; the authors' code clips at 10
    "fedmuon_table2_digits_convnext_dir0.1_n100.yaml": 10.0,  # ditto (docs/algorithms.md section 0)
    "fedmuon_table4_tweets_minilm_lora_dir0.8_n4.yaml": 10.0,
    "fadamgt_table1_digits_convnext_dir0.1_n100.yaml": 1.0,  # not given: the Trainer default
    "prefed_fig1_digits_convnext_iid_n10.yaml": 1.0,
}


@pytest.mark.parametrize("name, clip", PAPER_CLIPPING.items())
def test_paper_recipes_carry_the_papers_clipping(name, clip):
    train = yaml.safe_load((ROOT / "recipes" / name).read_text())["train"]
    assert float(train["max_grad_norm"]) == clip



@pytest.mark.parametrize("hardware", [False, True])
def test_bf16_auto_in_a_recipe_is_bf16_only_where_it_has_hardware(tmp_path, monkeypatch, hardware):
    monkeypatch.setattr("fedhf.recipes.cpu_has_bf16_matmul", lambda: hardware)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    recipe = _tweets()
    recipe["train"]["bf16"] = "auto"
    assert load_recipe(_write(tmp_path, recipe)).train["bf16"] is hardware
    recipe["train"]["bf16"] = True  # an explicit value is left as given
    assert load_recipe(_write(tmp_path, recipe, "forced.yaml")).train["bf16"] is True


def test_a_recipes_lora_wrap_shows_no_deprecation_warning_from_peft(minilm):
    """peft reads the model's deprecated ``is_gradient_checkpointing`` when it wraps it (a transformers FutureWarning
    about peft's code); fedhf's own wrap of a recipe's lora: section drops that one warning."""
    from transformers import AutoModelForSequenceClassification

    from fedhf.recipes import _with_lora

    recipe = load_recipe(str(TWEETS))
    model = AutoModelForSequenceClassification.from_pretrained(minilm, num_labels=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = _with_lora(model, recipe, "SEQ_CLS")
    assert wrapped.peft_config["default"].r == recipe.lora["r"]
    assert not [str(w.message) for w in caught if "checkpointing" in str(w.message)]


def test_generation_rows_beyond_the_held_out_rows_warn_with_the_number_scored():
    from fedhf.recipes import generation_rows_warning

    assert generation_rows_warning(32, 32) is None and generation_rows_warning(0, 5) is None
    assert generation_rows_warning(50, 32) == (
        "`data.generation_rows`=50 but the held-out split has 32 rows (`data.eval_rows`): generation accuracy is "
        "scored on 32 prompts, the eval rows. Set `data.eval_rows` to 50 or more to score them all.")


@pytest.mark.parametrize("hardware", [True, False])
@pytest.mark.parametrize("flag", [["--bf16", "auto"], ["--bf16=auto"]])
def test_bf16_auto_on_the_command_line_means_what_it_means_in_a_recipe(tmp_path, monkeypatch, hardware, flag):
    import fedhf.recipes as recipes

    monkeypatch.setattr(recipes, "cpu_has_bf16_matmul", lambda: hardware)
    monkeypatch.setattr(recipes.torch.cuda, "is_available", lambda: False)
    recipe = recipes.load_recipe(str(TWEETS))
    args = recipe.training_arguments([*flag, "--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert args.bf16 is hardware
