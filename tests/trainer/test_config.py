"""Bad configuration is refused when the config is built, with a message naming the field and the fix."""

from __future__ import annotations

import pytest
from transformers import HfArgumentParser

from fedhf import FederatedConfig


def _config(tmp_path, **kw):
    return FederatedConfig(output_dir=str(tmp_path / "out"), report_to="none", **kw)


@pytest.mark.parametrize("overrides, message", [
    ({"dirichlet_alpha": 0.0}, "dirichlet_alpha"),
    ({"dirichlet_alpha": -1.0}, "dirichlet_alpha"),
    ({"num_clients": 4, "clients_per_round": 5}, "clients_per_round.*exceeds.*num_clients"),
    ({"local_steps": 0}, "local_steps"),
    ({"local_steps": -3}, "local_steps"),
    ({"num_rounds": 0}, "num_rounds"),
    ({"algorithm": "fedsomething"}, "Unknown algorithm 'fedsomething' in `algorithm`.*fedavg"),
    ({"local_optimizer": "adamm"}, "Unknown local optimizer 'adamm' in `local_optimizer`"),
    ({"correction": "magic"}, "Unknown correction 'magic' in `correction`.*proximal"),
    ({"server_rule": "krum"}, "Unknown server rule 'krum'.*trimmed_mean"),
    ({"partition": "shards"}, "partition"),
    ({"algorithm_kwargs": {"nope": 1}}, "algorithm_kwargs.*fedavg"),
    ({"local_optimizer": "adamw", "local_optimizer_kwargs": {"nesterov": True}}, "AdamW does not accept.*nesterov"),
    ({"algorithm_kwargs": "{not json"}, "algorithm_kwargs.*JSON"),
    ({"correction_kwargs": {"mu": 0.1}}, "correction_kwargs.*without `correction`"),
    ({"correction": "global_mix", "correction_kwargs": {"beta": 1.0}}, "beta"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ({"average_tokens_across_devices": True}, "average_tokens_across_devices"),
    ({"min_partition_size": 0}, "min_partition_size"),
    ({"state_sync": "gossip"}, "Unknown state sync 'gossip' in `state_sync`.*average_warmstart"),
    ({"state_sync_kwargs": {"fraction": 0.1}}, "state_sync_kwargs.*without `state_sync`"),
    ({"algorithm": "fedmuon_svd", "state_sync": "compressed_average", "state_sync_kwargs": {"fraction": 1.5}},
     "fraction"),
    ({"algorithm": "local_adamw", "state_sync": "average_warmstart"}, "cannot import.*fedhf local optimizer"),
    ({"server_rule": "preconditioned_mix"}, "preconditioned_mix.*needs the local optimizer FOOF.*local_optimizer"),
    ({"algorithm": "local_sophia", "algorithm_kwargs": {"hessian_estimator": "exact"}},
     "local_optimizer_kwargs.*Sophia.*hessian_estimator"),
    ({"algorithm": "fadam_gt", "algorithm_kwargs": {"tracked_fraction": 0.0}}, "tracked_fraction"),
])
def test_bad_config_is_refused_with_the_field_named(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **overrides)
    assert not (tmp_path / "out").exists()


def test_components_replace_axes_of_a_named_algorithm(tmp_path):
    cfg = _config(tmp_path, algorithm="fedavg", local_optimizer="adamw", server_rule="yogi",
                  server_rule_kwargs='{"lr": 0.02}', correction="proximal", correction_kwargs={"mu": 0.01})
    algo = cfg.build_algorithm()
    assert algo.local_optimizer.cls.__name__ == "AdamW"
    assert algo.local_optimizer.lr == pytest.approx(1e-3)  # AdamW's own default, not FedAvg's SGD lr of 0.1
    assert algo.server_rule.transforms[0].kind == "yogi" and algo.server_rule.transforms[0].lr == 0.02
    assert algo.correction.mu == 0.01
    assert algo.name == "fedavg[local_optimizer=adamw,correction=proximal,server_rule=yogi]"


def test_learning_rate_and_weight_decay_override_paper_defaults(tmp_path):
    assert _config(tmp_path, algorithm="scaffold").build_algorithm().local_optimizer.kwargs["lr"] == 0.1
    algo = _config(tmp_path, algorithm="scaffold", learning_rate=0.02, weight_decay=0.0).build_algorithm()
    assert algo.local_optimizer.kwargs["lr"] == 0.02 and algo.local_optimizer.kwargs["weight_decay"] == 0.0


def test_command_line_and_yaml_parse(tmp_path):
    parser = HfArgumentParser(FederatedConfig)
    (cfg,) = parser.parse_args_into_dataclasses(args=[
        "--output_dir", str(tmp_path / "o"), "--algorithm", "fedcm", "--algorithm_kwargs", '{"beta": 0.5}',
        "--num_clients", "20", "--clients_per_round", "5", "--report_to", "none"])
    assert cfg.algorithm_kwargs == {"beta": 0.5} and cfg.build_algorithm().correction.beta == 0.5
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'o'}\nalgorithm: fedprox\nalgorithm_kwargs: {{mu: 0.01}}\n"
                      "num_clients: 8\nreport_to: none\n")
    (cfg,) = parser.parse_yaml_file(str(recipe))
    assert cfg.num_clients == 8 and cfg.clients_per_round == 8 and cfg.build_algorithm().correction.mu == 0.01
