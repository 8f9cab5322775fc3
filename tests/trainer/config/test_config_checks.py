"""Config checks in FederatedConfig.__post_init__: YAML numeric strings, mixed precision on the CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
import yaml
from transformers import HfArgumentParser

from fedhf import FederatedConfig


def test_yaml_numbers_written_as_strings_are_coerced(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'out'}\nreport_to: none\nuse_cpu: true\nlearning_rate: 1e-3\n"
                      "max_grad_norm: 1e0\nnum_clients: '4'\nclients_per_round: 2\n")
    assert isinstance(yaml.safe_load(recipe.read_text())["learning_rate"], str)  # YAML 1.1 reads 1e-3 as text
    (args,) = HfArgumentParser(FederatedConfig).parse_yaml_file(str(recipe))
    assert args.learning_rate == 1e-3 and isinstance(args.learning_rate, float)
    assert args.max_grad_norm == 1.0 and args.num_clients == 4 and isinstance(args.num_clients, int)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="fp16 is valid with a GPU")
@pytest.mark.parametrize("field", ["fp16", "fp16_full_eval"])
def test_fp16_on_the_cpu_is_refused_with_the_fix(tmp_path, field):
    with pytest.raises(ValueError, match=f"`{field}=True` needs a GPU.*{field}=False"):
        FederatedConfig(output_dir=str(tmp_path / "out"), report_to="none", **{field: True})
    assert not (tmp_path / "out").exists()


def test_bf16_on_the_cpu_is_accepted_with_use_cpu(tmp_path):
    assert FederatedConfig(output_dir=str(tmp_path / "o"), report_to="none", use_cpu=True, bf16=True).bf16


@pytest.mark.parametrize("hardware", [False, True])
def test_bf16_on_a_cpu_that_emulates_it_warns_with_the_faster_setting(tmp_path, monkeypatch, hardware):
    monkeypatch.setattr("fedhf.trainer.config.config_checks.cpu_has_bf16_matmul", lambda: hardware)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = FederatedConfig(output_dir=str(tmp_path / "o"), report_to="none", use_cpu=True, bf16=True)
    ours = [w for w in caught if "bfloat16 matmul units" in str(w.message)]
    assert config.bf16  # honoured either way
    assert len(ours) == (0 if hardware else 1)
    if not hardware:
        assert "Set bf16=False" in str(ours[0].message)
