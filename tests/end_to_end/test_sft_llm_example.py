"""examples/sft_llm.py: offline it stops at once naming the bundled flags; on the bundled tiny Llama and tweet
instructions it runs end to end and records eval loss, perplexity = exp(eval loss) and generation accuracy."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "sft_llm.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def run(args, tmp_path):
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=ENV, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)


def test_offline_hub_names_fail_at_once_naming_the_flags(tmp_path):
    done = run(["--output_dir", str(tmp_path / "out")], tmp_path)
    assert done.returncode != 0
    assert "--model_name_or_path bundled-gemma-3-270m --dataset bundled-tweets-instructions" in done.stderr
    assert "bundled-tiny-llama" in done.stderr  # the quick alternative
    # the defaults a flag did not set, and the YAML they came from (gradient accumulation 4 was a surprise)
    assert "defaults from " in done.stdout and "sft_smollm2_lora_fedmuon_dolly.yaml" in done.stdout
    assert "gradient_accumulation_steps=4" in done.stdout
    assert not (tmp_path / "out").exists()  # nothing written


def test_bundled_run_records_loss_perplexity_and_generation_accuracy(tmp_path):
    out = tmp_path / "out"
    done = run(["--model_name_or_path", "bundled-tiny-llama", "--dataset", "bundled-tweets-instructions",
                "--output_dir", str(out), "--num_rounds", "2", "--local_steps", "2", "--num_clients", "4",
                "--clients_per_round", "2", "--train_rows", "128", "--eval_rows", "16", "--generation_rows", "16",
                "--max_length", "40", "--eval_every_rounds", "1", "--disable_tqdm", "true",
                "--learning_rate", "0.02"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    history = json.loads((out / "federated_history.json").read_text())
    evaluated = [h for h in history if "eval_loss" in h]
    assert [h["round"] for h in evaluated] == [0, 1, 2]
    for h in evaluated:
        assert h["eval_perplexity"] == math.exp(h["eval_loss"])
        assert 0.0 <= h["eval_generation_accuracy"] <= 1.0
        assert 0.0 <= h["eval_generation_unparseable_rate"] <= 1.0  # the tweets' closed set of answers:
        assert h["eval_loglik_accuracy"] in [k / 16 for k in range(17)] and h["eval_loglik_answer_logprob"] < 0
    assert "eval_loglik_accuracy" in (out / "final" / "README.md").read_text()  # in the model card
    assert evaluated[-1]["eval_loss"] < evaluated[0]["eval_loss"]
    assert (out / "final" / "adapter_model.safetensors").exists()
