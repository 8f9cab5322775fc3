"""examples/glue_fedmuon.py: runs offline on the bundled model and tweets, stops before any work (with a message
naming the flag to change) when a Hub name cannot be had offline, and its GLUE metrics match hand computations."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "glue_fedmuon.py"


@pytest.fixture(scope="module")
def glue():
    spec = importlib.util.spec_from_file_location("glue_fedmuon", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and HfArgumentParser resolve annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _run_script(args, tmp_path, **env):
    # One OpenMP thread: on 2 cores shared with other work, 2 spinning threads made this run 6x slower (103 s vs 17 s).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "TOKENIZERS_PARALLELISM": "false", **env}
    start = time.time()
    done = subprocess.run([sys.executable, str(SCRIPT), *args], check=False, env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    return done, time.time() - start


# ------------------------------------------------------------------ end to end, offline
def test_runs_offline_on_bundled_minilm_and_tweets(tmp_path):
    out = tmp_path / "out"
    done, _ = _run_script([
        "--model_name_or_path", "bundled-minilm", "--task", "bundled-tweets", "--train_rows", "64", "--eval_rows",
        "32", "--max_length", "32", "--num_clients", "4", "--clients_per_round", "2", "--num_rounds", "2",
        "--local_steps", "2", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "32",
        "--output_dir", str(out), "--report_to", "none", "--disable_tqdm", "true", "--partition_report", "false",
    ], tmp_path)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    final = json.loads(done.stdout.strip().splitlines()[-1])
    assert final["algorithm"] == "fedmuon" and final["round"] == 2
    assert 0.0 <= final["eval_accuracy"] <= 1.0 and math.isfinite(final["eval_loss"])
    assert (out / "adapter_model.safetensors").exists() and (out / "adapter_config.json").exists()
    assert (out / "tokenizer_config.json").exists()
    assert json.loads((out / "federated_history.json").read_text())[-1]["eval_accuracy"] == final["eval_accuracy"]


# ------------------------------------------------------------------ Hub names that cannot be had offline
def test_uncached_hub_model_offline_fails_fast_with_the_flag_to_change(tmp_path):
    out = tmp_path / "out"
    done, seconds = _run_script(["--output_dir", str(out), "--report_to", "none"], tmp_path,
                                HF_HOME=str(tmp_path / "empty_hf_home"))  # default roberta-base, surely uncached
    assert done.returncode != 0
    assert seconds < 40, seconds  # imports take 5-15 s on 2 busy cores; the check itself, milliseconds
    assert "--model_name_or_path roberta-base is not available offline (HF_HUB_OFFLINE=1)" in done.stderr
    # both flags in one message: the model's and the default GLUE task's (no second round trip)
    assert "run offline with --model_name_or_path bundled-minilm --task bundled-tweets" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() or not any(out.iterdir())


def test_uncached_glue_offline_names_the_task_flag(glue, tmp_path, monkeypatch):
    monkeypatch.setattr(glue.datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty_datasets_cache")
    out = tmp_path / "out"
    with pytest.raises(glue.OfflineError, match=r"--task sst2 reads nyu-mll/glue .* \(HF_HUB_OFFLINE=1\)") as err:
        glue.main(["--model_name_or_path", "bundled-minilm", "--output_dir", str(out), "--report_to", "none"])
    assert "--task bundled-tweets" in str(err.value)
    assert not out.exists()


def test_unreachable_hub_without_offline_flag_fails_at_once(glue, tmp_path, monkeypatch):
    monkeypatch.setattr(glue, "is_offline_mode", lambda: False)
    monkeypatch.setattr(glue.hub_constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    start = time.time()
    with pytest.raises(glue.OfflineError, match=r"unreachable\); set HF_HUB_OFFLINE=1") as err:
        glue.main(["--model_name_or_path", "bundled-minilm", "--output_dir", str(tmp_path / "out")])
    assert "--task sst2" in str(err.value) and time.time() - start < 10


def test_push_to_hub_offline_is_refused_before_training(glue, tmp_path):
    # FederatedConfig refuses it while the arguments are parsed, before any model or data is loaded.
    with pytest.raises(ValueError, match="push_to_hub=True` but the Hub is offline.*push_to_hub=False"):
        glue.main(["--model_name_or_path", "bundled-minilm", "--task", "bundled-tweets", "--push_to_hub", "true",
                   "--hub_model_id", "someone/glue-fedmuon", "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_task_table_and_stsb_defaults_to_iid(glue, tmp_path):
    assert set(glue.TASKS) >= {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"}
    assert glue.TASKS["stsb"].num_labels == 1 and glue.TASKS["mnli"].num_labels == 3
    script, args = glue.parse_arguments(["--task", "stsb", "--output_dir", str(tmp_path)])
    assert args.partition == "iid" and args.algorithm == "fedmuon"
    script, args = glue.parse_arguments(["--output_dir", str(tmp_path)])
    assert (script.model_name_or_path, script.task, script.max_length, script.lora_r, script.lora_alpha,
            script.lora_dropout) == ("roberta-base", "sst2", 128, 16, 32, 0.05)
    assert (args.partition, args.dirichlet_alpha, args.num_clients, args.clients_per_round, args.num_rounds,
            args.local_steps, args.per_device_train_batch_size) == ("dirichlet", 0.8, 20, 4, 100, 50, 16)
