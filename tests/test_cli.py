"""The ``fedhf`` command: algorithms lists every named algorithm with its axes, partition writes only the report,
train runs a recipe on a tiny budget, and the command and examples/quickstart_tweets.py give the same adapter."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest
import yaml
from safetensors.torch import load_file

from fedhf.algorithms import compose, get_algorithm, list_algorithms
from fedhf.cli import main
from tests.helpers import without_timings

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


def test_algorithms_lists_every_named_algorithm_with_names_the_config_accepts(capsys):
    from fedhf.corrections import CORRECTIONS
    from fedhf.optim import LOCAL_OPTIMIZERS
    from fedhf.server import SERVER_RULES
    from fedhf.sync import STATE_SYNCS

    assert main(["algorithms"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert sorted(rows) == list_algorithms() and len(rows) == len(list_algorithms())
    for name, (optimizer, sync, correction, rule, lr, matrix_lr, server_lr, secagg) in rows.items():
        assert (optimizer in LOCAL_OPTIMIZERS and sync in STATE_SYNCS and correction in CORRECTIONS
                and rule in SERVER_RULES), (name, optimizer, sync, correction, rule)
        # the four names rebuild the algorithm's axes (its own hyperparameters aside)
        algo, rebuilt = get_algorithm(name), compose(name, local_optimizer=optimizer, state_sync=sync,
                                                     correction=correction, server_rule=rule)
        for axis in ("state_sync", "correction", "server_rule"):
            assert type(getattr(rebuilt, axis)) is type(getattr(algo, axis)), (name, axis)
        rules = (rebuilt.server_rule, algo.server_rule)
        assert [type(r.aggregator) for r in rules] == [type(rules[1].aggregator)] * 2
        assert [t.name for t in rules[0].transforms] == [t.name for t in rules[1].transforms], name
        assert rebuilt.local_optimizer.optimizer == algo.local_optimizer.optimizer
        # the default lrs are the algorithm's own: its clients', Muon's matrices' and its server's
        assert float(lr) == algo.local_optimizer.lr and float(server_lr.split(",")[0]) > 0
        assert (matrix_lr != "-") == (optimizer == "muon")
        assert secagg == "yes"  # every named algorithm's server halves read sums only (robust rules are not named)
    assert rows["fedpac_muon"][4:7] == ["0.0003", "0.03", "1"] and rows["local_soap"][4:7] == ["0.003", "-", "1"]
    assert rows["fadam_gt"][2] == "gradient_tracking" and rows["scaffold"][:4] == ["sgd", "reset", "control_variate",
                                                                                 "mean"]


def _run_with_imports(*args: str):
    """``python -X importtime *args`` from the repository: its stdout, stderr (the import lines removed) and the set
    of modules it imported (importtime writes one ``import time: self | cumulative | name`` line per module)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, check=True)
    lines = done.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    return done.stdout, "\n".join(line for line in lines if not line.startswith("import time:")), imported


HEAVY = {"transformers", "peft", "bitsandbytes", "trl", "datasets"}  # seconds to import; bitsandbytes comes with peft


def test_import_help_version_and_algorithms_load_no_transformers_peft_or_bitsandbytes():
    """``import fedhf`` and the commands that train nothing stay fast and quiet; ``python -m fedhf`` is the command."""
    from fedhf import __version__

    for args, expected in ((["-c", "import fedhf"], ""), (["-m", "fedhf", "--help"], "usage: fedhf"),
                           (["-m", "fedhf", "--version"], f"fedhf {__version__}"),
                           (["-m", "fedhf", "algorithms"], "control_variate")):
        out, err, imported = _run_with_imports(*args)
        assert expected in out and not HEAVY & imported and not err.strip(), (args, HEAVY & imported, err)
        assert "fedhf" in imported


def test_train_help_loads_the_trainer_without_bitsandbytes_kernel_notice():
    """Loading the trainer imports peft and with it bitsandbytes (when installed), whose CPU backend logs "Failed to
    load CPU gemm_4bit_forward from kernels-community" at import: fedhf drops that one record."""
    out, err, imported = _run_with_imports("-m", "fedhf", "train", "--help")
    assert "Overridable fields" in out and {"transformers", "peft"} <= imported
    assert "gemm_4bit_forward" not in err and "kernels-community" not in err, err


def test_partition_writes_the_report_and_no_model(tmp_path):
    out = tmp_path / "part"
    main(["partition", "--config", str(TWEETS), "--output_dir", str(out)])
    assert sorted(os.listdir(out)) == ["partition.json", "partition.png"]
    report = json.loads((out / "partition.json").read_text())
    counts = report["counts"]
    assert len(counts) == 12 and sum(map(sum, counts)) == 8000  # the recipe's clients and train_rows
    assert min(map(sum, counts)) >= 20 and report["algorithm"].startswith("scaffold")


def test_partition_of_a_recipe_for_an_fsdp_launch_runs_on_one_process(tmp_path, capsys):
    """The split does not depend on sharding: the report of a recipe written for an FSDP launch equals the plain one
    (training it on one process is refused, naming the launch)."""
    recipe = yaml.safe_load(TWEETS.read_text())
    recipe["train"].update(fsdp="full_shard", fsdp_config={"reshard_after_forward": True})
    sharded = tmp_path / "fsdp.yaml"
    sharded.write_text(yaml.safe_dump(recipe))
    main(["partition", "--config", str(sharded), "--output_dir", str(tmp_path / "fsdp")])
    main(["partition", "--config", str(TWEETS), "--output_dir", str(tmp_path / "plain")])
    assert (json.loads((tmp_path / "fsdp" / "partition.json").read_text())
            == json.loads((tmp_path / "plain" / "partition.json").read_text()))
    capsys.readouterr()
    assert main(["train", "--config", str(sharded), "--output_dir", str(tmp_path / "train")]) == 2
    assert "was not launched with others" in capsys.readouterr().err


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
        assert main(argv) == 2, f"{argv} was accepted"  # one line on stderr, exit status 2
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


def _files(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(pathlib.Path(folder).rglob("*")) if p.is_file()}


def test_ctrl_c_names_the_resume_command_which_ends_as_the_uninterrupted_run_and_deletes_nothing(
        tmp_path, monkeypatch, capsys):
    """Ctrl-C in round 3 (a KeyboardInterrupt where SIGINT would raise it), then the printed command: checkpoint-1
    and -2 are untouched although the command says overwrite_output_dir, and the model is the uninterrupted one."""
    from fedhf import FederatedTrainer

    flags = ["--num_rounds", "3", "--local_steps", "1", "--clients_per_round", "2", "--save_every_rounds", "1",
             "--eval_every_rounds", "3", "--overwrite_output_dir", "true", *TINY[4:]]
    assert main(["train", "--config", str(DIGITS), "--output_dir", str(tmp_path / "full"), *flags]) == 0
    run_round = FederatedTrainer._run_round

    def interrupted_in_round_3(self, run, *args):
        if run.rounds_done == 2:
            raise KeyboardInterrupt
        return run_round(self, run, *args)

    monkeypatch.setattr(FederatedTrainer, "_run_round", interrupted_in_round_3)
    cut = tmp_path / "cut"
    capsys.readouterr()
    assert main(["train", "--config", str(DIGITS), "--output_dir", str(cut), *flags]) == 130
    message = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' progress bars
    assert message.startswith("fedhf: interrupted; ") and f"last checkpoint {cut / 'checkpoint-2'}" in message
    assert f"train(resume_from_checkpoint={str(cut / 'checkpoint-2')!r})" in message
    monkeypatch.undo()
    kept = {name: _files(cut / name) for name in ("checkpoint-1", "checkpoint-2")}
    command = shlex.split(message.split("resume with: ", 1)[1].split("  (Python", 1)[0])
    assert command[:2] == ["fedhf", "train"] and command[-1] == "--resume"
    assert main(command[1:]) == 0
    assert f"resuming from {cut / 'checkpoint-2'} (2/3 rounds done)" in capsys.readouterr().out
    assert {name: _files(cut / name) for name in kept} == kept
    resumed, uninterrupted = (load_file(d / "final" / "model.safetensors") for d in (cut, tmp_path / "full"))
    # BatchNorm's num_batches_tracked counts the resident model's batches (unused: momentum is set), not federated
    counted = {name for name in resumed if name.endswith("num_batches_tracked")}
    assert sorted(resumed) == sorted(uninterrupted) and len(resumed) > len(counted)
    assert all(bool((resumed[n] == uninterrupted[n]).all()) for n in resumed if n not in counted)
    histories = [json.loads((d / "federated_history.json").read_text()) for d in (tmp_path / "full", cut)]
    assert without_timings(histories[0]) == without_timings(histories[1]) and histories[1][-1]["round"] == 3
    assert all(h["round_runtime"] > 0 for h in histories[1])  # each round's wall time


def test_input_errors_are_one_line_with_the_closest_name_and_no_file_written(tmp_path, capsys):
    out = tmp_path / "never"
    cases = {("--num_rouns", "2"): "unknown option --num_rouns. Did you mean --num_rounds?",
             ("--num_round", "2"): "unknown option --num_round. Did you mean --num_rounds?",  # no abbreviations
             ("--lr", "0.1"): "Did you mean --learning_rate?",
             ("--image_size", "16"): "--image_size is a key of the recipe's `data:` section",
             ("--algorithm", "fedpac_mun"): "Did you mean 'fedpac_muon'?",
             ("--num_rounds", "two"): "invalid int value: 'two'",
             ("--resume_from_checkpoint", "true"): "use --resume"}
    for flags, expected in cases.items():
        assert main(["partition", "--config", str(DIGITS), "--output_dir", str(out), *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith("fedhf: error: ") and len(err.strip().splitlines()) == 1 and expected in err, err
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist (--config)" in capsys.readouterr().err
    assert main(["train", "--config", str(DIGITS), "--output_dir", str(out), "--resume"]) == 2
    assert "holds no complete checkpoint-N" in capsys.readouterr().err
    with pytest.raises(ValueError, match="Did you mean 'scaffold'"):  # --debug: the exception, with its traceback
        main(["partition", "--config", str(DIGITS), "--algorithm", "scafold", "--debug"])
    assert not out.exists()


def test_version_and_train_help_list_the_fields_by_group(capsys):
    from fedhf import __version__

    for argv in (["--version"], ["train", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"fedhf {__version__}\n") and "docs/configuration.md" in out
    for group, field_name in (("the federation and its algorithm:", "num_rounds"), ("the data split:",
                              "dirichlet_alpha"), ("privacy:", "dp_epsilon"), ("TrainingArguments", "seed")):
        assert group in out and f" {field_name}," in out.split(group, 1)[1]


def test_push_to_hub_without_a_network_gets_fedhfs_message(tmp_path, monkeypatch, capsys):
    """A token but no Hub (a closed local port stands for a missing network): one line naming the flag."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")
    out = tmp_path / "push"
    assert main(["train", "--config", str(DIGITS), "--output_dir", str(out), "--push_to_hub", "true",
                 "--hub_model_id", "someone/fedhf-test", *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedhf: error: push_to_hub=True could not reach the Hub") and "--push_to_hub false" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_the_summary_line_gives_epsilon_and_delta_under_dp():
    from types import SimpleNamespace

    from fedhf.cli import summary_line

    args = SimpleNamespace(dp_delta=None, num_clients=300, output_dir="out")
    last = {"round": 3, "eval_loss": 1.0571, "eval_accuracy": 0.436, "dp_epsilon": 3.0004}
    assert summary_line(last, args) == ("round 3: eval_loss 1.0571, eval_accuracy 0.4360; epsilon 3 at delta "
                                        "0.0019 (client-level DP) -- outputs in out")
    assert summary_line({"round": 2}, args) == "round 2: no evaluation -- outputs in out"
