"""FSDP2 over the resident model (fedhf/runtime/sharded.py): 2 processes under torchrun (gloo, CPU) give the
1-process model for five algorithms with full weights and with LoRA; save_model writes one consolidated checkpoint;
what cannot run on shards is refused before any work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from fedhf.runtime import sharded
from fedhf.runtime.sharded import chunk_rows
from fedhf.trainer.config import federated_config
from tests.end_to_end.test_multiprocess import TORCHRUN, _LAUNCH_TROUBLE
from tests.helpers import config, tiny_llama_lora, tweet_trainer
from tests.scripts.fsdp_run import out_file

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "fsdp_run.py")
ALGORITHMS = ["fedavg", "scaffold", "fadam_gt", "fedpac_muon", "local_soap"]
CASES = [f"{a}:{w}" for w in ("full", "lora") for a in ALGORITHMS]
# Muon's bfloat16 Newton-Schulz and SOAP's Adam in a rank-deficient eigenbasis turn the last-bit differences of
# splitting a batch over 2 processes into visible ones, with FSDP or without (client_parallel alone): for these the
# 2-process run without FSDP is launched too, and FSDP must add nothing to its deviation.
AMPLIFIED = ["fedpac_muon:full", "local_soap:full", "local_soap:lora"]
RESUMED = "fadam_gt:lora"  # per-client state (v_hat) in the store, Theta synced, a correction: all in shards


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _finish(process, command) -> str:
    """The launch's output; a launch that could not set up its process group (a port taken) is run once more."""
    out, err = process.communicate(timeout=600)
    code = process.returncode
    if code != 0 and any(marker in err for marker in _LAUNCH_TROUBLE):
        done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
        out, err, code = done.stdout, done.stderr, done.returncode
    assert code == 0, (out[-1500:], err[-3000:])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 1-process launch and one 2-process FSDP launch (both at once), every case in each."""
    if TORCHRUN is None:
        pytest.skip("torchrun not installed")
    root = tmp_path_factory.mktemp("fsdp")
    one, two = root / "one", root / "two"
    one.mkdir(), two.mkdir()
    commands = [[sys.executable, SCRIPT, str(one), "plain", *CASES],
                [TORCHRUN, "--standalone", "--nproc_per_node", "2", SCRIPT, str(two), "fsdp", *CASES,
                 *(f"{case}:parallel" for case in AMPLIFIED), f"{RESUMED}:resume"]]
    started = [subprocess.Popen(c, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for c in commands]
    outputs = [_finish(process, command) for process, command in zip(started, commands)]
    assert outputs[1].count("world_size 2") == len(CASES) + len(AMPLIFIED) + 1
    return {"one": one, "two": two}


def _load(folder, case):
    return load_file(out_file(str(folder), case))


def _deviation(a, b) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if not k.startswith("history."))


@pytest.mark.parametrize("case", CASES)
def test_two_fsdp_processes_give_the_one_process_model(runs, case):
    """The whole model gathered from the 2 processes' shards against one process's model, and the round's log:
    the same participants and bytes (each shard's bytes summed), loss and drift (its squared norms summed)."""
    one, two = _load(runs["one"], case), _load(runs["two"], case)
    assert one.keys() == two.keys()
    for key in ("history.participants", "history.uplink_MB", "history.downlink_MB"):
        assert float(two[key]) == float(one[key]), key
    if case in AMPLIFIED:
        parallel = _load(runs["two"], f"{case}:parallel")
        assert _deviation(two, one) <= 2 * _deviation(parallel, one) + 1e-6  # measured: 0.9-1.2x
        return
    torch.testing.assert_close(two["history.train_loss"], one["history.train_loss"], rtol=1e-6, atol=0)
    if "history.precond_drift" in one:
        torch.testing.assert_close(two["history.precond_drift"], one["history.precond_drift"], rtol=1e-4, atol=0)
    for name in one:  # measured: at most 6e-8 on entries up to 0.1
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=5e-6, msg=name)


def test_a_stopped_fsdp_run_resumes_from_its_sharded_checkpoint_to_the_same_model(runs):
    """Stopped after round 1, then a fresh model and trainer resume checkpoint-1 (each process its own rows): the
    model of the uninterrupted run, bit for bit."""
    resumed, whole = _load(runs["two"], f"{RESUMED}:resume"), _load(runs["two"], RESUMED)
    assert float(resumed.pop("history.first_run_rounds")) == 1.0
    checkpoint = runs["two"] / f"{RESUMED.replace(':', '-')}-resume" / "run" / "checkpoint-1"
    files = set(os.listdir(checkpoint))
    assert {"global_params@rank0.safetensors", "global_params@rank1.safetensors",
            "client_store@rank0.safetensors", "client_store@rank1.safetensors"} <= files
    assert "model.safetensors" not in files and os.path.isfile(checkpoint / "model" / "adapter_model.safetensors")
    assert resumed.keys() == whole.keys()
    for name in resumed:
        assert torch.equal(resumed[name], whole[name]), name


def test_save_model_writes_one_consolidated_checkpoint_that_from_pretrained_loads(runs):
    from transformers import LlamaForCausalLM

    saved = runs["two"] / "fedavg-full-saved"
    assert [f for f in os.listdir(saved) if f.endswith(".safetensors")] == ["model.safetensors"]
    model = LlamaForCausalLM.from_pretrained(saved)
    trained = _load(runs["two"], "fedavg:full")
    loaded = dict(model.named_parameters())
    for name in (n for n in trained if not n.startswith("history.")):
        torch.testing.assert_close(loaded[name].detach(), trained[name], rtol=0, atol=0, msg=name)


def test_rows_are_chunked_as_fsdp_shards_them():
    """FSDP2's layout: torch.chunk on dim 0, padded with empty chunks (5 rows over 4 ranks: 2, 2, 1, 0)."""
    chunks = chunk_rows(torch.arange(10).reshape(5, 2), 4)
    assert [c.shape[0] for c in chunks] == [2, 2, 1, 0]
    assert torch.equal(torch.cat(chunks), torch.arange(10).reshape(5, 2))


@pytest.mark.parametrize("fsdp_config", [{"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 1000000},
                                         {"state_dict_type": "SHARDED_STATE_DICT"},
                                         {"mixed_precision_policy": {"param_dtype": "bfloat16"}},
                                         {"limit_all_gathers": True}, {"fsdp_backward_prefetch": "BACKWARD_PRE"}])
def test_fsdp_config_keys_fedhf_does_not_apply_are_refused(tmp_path, monkeypatch, fsdp_config):
    with pytest.raises(ValueError, match=r"`fsdp_config` keys .* are not applied by fedhf.*remove them"):
        config(tmp_path, fsdp=True, fsdp_config=fsdp_config)
    monkeypatch.setattr(federated_config, "check_fsdp_launch", lambda args: None)  # as a launched process sees it
    read = {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "reshard_after_forward": False, "version": 2}
    assert config(tmp_path, fsdp="full_shard", fsdp_config=read).client_parallel


def test_a_layer_class_that_no_module_has_is_refused(tokenizer):
    """A misspelt class would leave the root as the only FSDP unit (nothing divided), as accelerate refuses it."""
    model = tiny_llama_lora(len(tokenizer))
    assert len(sharded.transformer_layers(model, None)) == len(sharded.transformer_layers(model, ["LlamaDecoderLayer"]))
    assert sharded.transformer_layers(model, None)
    with pytest.raises(ValueError, match=r"\['NoSuchLayer'\].*LlamaDecoderLayer"):
        sharded.transformer_layers(model, ["NoSuchLayer", "LlamaDecoderLayer"])


def test_what_cannot_run_on_shards_is_refused_before_work(tmp_path, tweets, tokenizer, monkeypatch):
    with pytest.raises(ValueError, match="FSDP version 1 is not supported"):
        config(tmp_path, fsdp=True, fsdp_config={"version": 1})
    with pytest.raises(ValueError, match="activation_checkpointing"):
        config(tmp_path, fsdp=True, fsdp_config={"activation_checkpointing": True})
    with pytest.raises(ValueError, match=r"N >= 2"):  # one process on a CPU: fedhf's message, not Trainer's
        config(tmp_path, fsdp=True)
    with monkeypatch.context() as launched:  # as a process of torchrun --nproc_per_node 2 sees it
        launched.setattr(federated_config, "check_fsdp_launch", lambda args: None)
        assert config(tmp_path, fsdp=True).client_parallel  # FSDP trains every client on all processes together
    # as `accelerate launch --config_file <an FSDP config>` starts the script (Trainer itself refuses `fsdp=True`
    # in a process that was not launched with others)
    monkeypatch.setattr(sharded, "LAUNCH_ENVIRONMENT", {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"})
    model = tiny_llama_lora(len(tokenizer))
    with pytest.raises(ValueError, match=r"`fsdp`.*server_rule='flexlora'.*drift_spectral"):
        tweet_trainer(model, tweets, tokenizer, config(tmp_path, server_rule="flexlora", drift_spectral=True))
    with pytest.raises(ValueError, match="torchrun"):  # one process, no process group: nothing to shard over
        tweet_trainer(model, tweets, tokenizer, config(tmp_path))
    assert not (tmp_path / "run").exists() or os.listdir(tmp_path / "run") == []


@pytest.mark.parametrize("value", [{"FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP", "FSDP_MIN_NUM_PARAMS": "1000000"},
                                   {"FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT"}])
def test_accelerate_fsdp_values_fedhf_would_replace_are_refused(tmp_path, monkeypatch, value):
    """An accelerate config's size-based wrap or sharded state dict would be replaced by the decoder-layer units and
    one consolidated save without a word; the documented config's values are accepted."""
    documented = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
                  "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT", "FSDP_SHARDING_STRATEGY": "FULL_SHARD",
                  "FSDP_CPU_RAM_EFFICIENT_LOADING": "false", "FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer"}
    args = config(tmp_path)
    monkeypatch.setattr(sharded, "LAUNCH_ENVIRONMENT", documented)
    assert sharded.fsdp_settings(args).layer_classes == ("LlamaDecoderLayer",)
    monkeypatch.setattr(sharded, "LAUNCH_ENVIRONMENT", {**documented, **value})
    with pytest.raises(ValueError, match=r"not applied by fedhf.*in the accelerate config"):
        sharded.fsdp_settings(args)
