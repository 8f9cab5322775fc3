"""The ``fedhf`` command: algorithms lists every named algorithm with its axes, partition writes only the report,
train runs a recipe on a tiny budget, and the command and examples/quickstart_tweets.py give the same adapter."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import yaml
from safetensors.torch import load_file

from fedhf.algorithms import get_algorithm, list_algorithms
from fedhf.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent
TWEETS = ROOT / "recipes" / "tweets_minilm_lora_scaffold_dir0.3_n12.yaml"
DIGITS = ROOT / "recipes" / "digits_resnet_fedpac_muon_dir0.5_n8.yaml"
# bf16 off: its matmuls are emulated (~500x slower) on CPUs without AVX-512 BF16/AMX.
TINY = ["--num_rounds", "1", "--local_steps", "2", "--disable_tqdm", "true", "--bf16", "false"]


def _tiny_tweets_recipe(tmp_path, rows=200) -> str:
    values = yaml.safe_load(TWEETS.read_text())
    values["data"].update(train_rows=rows, eval_rows=50)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_algorithms_lists_every_named_algorithm_with_its_axes(capsys):
    assert main(["algorithms"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert sorted(rows) == list_algorithms() and len(rows) == 30
    for name, axes in rows.items():
        algo = get_algorithm(name)
        assert axes[:4] == [algo.local_optimizer.cls.__name__, algo.state_sync.name, algo.correction.name,
                            algo.server_rule.name]
        assert axes[4] == "yes"  # every named algorithm's server halves read sums only (robust rules are not named)


def test_python_dash_m_fedhf_runs_the_command():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "fedhf", "algorithms"], capture_output=True, text=True, env=env,
                         cwd=ROOT, check=True).stdout
    assert "scaffold" in out and "control_variate" in out


def test_partition_writes_the_report_and_no_model(tmp_path):
    out = tmp_path / "part"
    main(["partition", "--config", str(TWEETS), "--output_dir", str(out)])
    assert sorted(os.listdir(out)) == ["partition.json", "partition.png"]
    report = json.loads((out / "partition.json").read_text())
    counts = report["counts"]
    assert len(counts) == 12 and sum(map(sum, counts)) == 8000  # the recipe's clients and train_rows
    assert min(map(sum, counts)) >= 20 and report["algorithm"].startswith("scaffold")


def test_partition_takes_the_label_free_split_settings(tmp_path):
    from fedhf.data import power_law_sizes

    out = tmp_path / "part"
    main(["partition", "--config", str(TWEETS), "--output_dir", str(out), "--partition_key", "length",
          "--partition_column", "text", "--partition_key_buckets", "3", "--quantity_skew", "1.0",
          "--client_eval_fraction", "0.1"])
    report = json.loads((out / "partition.json").read_text())
    assert report["key"] == "length of `text` in characters (3 quantile buckets)" and len(report["classes"]) == 3
    whole = [a + b for a, b in zip(report["sizes"], report["eval_sizes"])]
    assert whole == power_law_sizes(8000, 12, 1.0, 20).tolist()  # the recipe's rows, clients, min_partition_size
    assert [sum(row) for row in report["counts"]] == report["sizes"]


def test_bad_override_fails_before_any_file_is_written(tmp_path):
    out = tmp_path / "never"
    for argv in (["train", "--config", str(DIGITS), "--output_dir", str(out), "--num_client", "3"],
                 ["partition", "--config", str(DIGITS), "--output_dir", str(out), "--algorithm", "fedsomething"]):
        try:
            main(argv)
        except (SystemExit, ValueError):
            pass
        else:
            raise AssertionError(f"{argv} was accepted")
    assert not out.exists()


def test_train_runs_a_recipe_and_writes_model_and_history(tmp_path, capsys):
    out = tmp_path / "digits"
    assert main(["train", "--config", str(DIGITS), "--output_dir", str(out), "--clients_per_round", "2", *TINY]) == 0
    history = json.loads((out / "federated_history.json").read_text())
    assert [h["round"] for h in history] == [1] and 0.0 <= history[-1]["eval_accuracy"] <= 1.0
    assert f"eval_accuracy {history[-1]['eval_accuracy']:.4f}" in capsys.readouterr().out
    assert (out / "final" / "model.safetensors").exists() and (out / "final" / "config.json").exists()


def test_command_and_example_give_the_bit_identical_adapter(tmp_path, monkeypatch):
    flags = [*TINY, "--clients_per_round", "2", "--min_partition_size", "5", "--eval_on_start", "false"]
    main(["train", "--config", _tiny_tweets_recipe(tmp_path), "--output_dir", str(tmp_path / "cli"), *flags])
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    sys.modules.pop("quickstart_tweets", None)
    import quickstart_tweets

    quickstart_tweets.main(["--output_dir", str(tmp_path / "example"), "--train_rows", "200", "--eval_rows", "50",
                            *flags])
    cli = load_file(tmp_path / "cli" / "final" / "adapter_model.safetensors")
    example = load_file(tmp_path / "example" / "final" / "adapter_model.safetensors")
    assert sorted(cli) == sorted(example) and len(cli) > 0
    for name in cli:
        assert cli[name].dtype == example[name].dtype and bool((cli[name] == example[name]).all()), name
    history = [json.loads((tmp_path / d / "federated_history.json").read_text()) for d in ("cli", "example")]
    assert history[0][-1]["eval_accuracy"] == history[1][-1]["eval_accuracy"]
