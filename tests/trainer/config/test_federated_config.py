"""Bad configuration is refused when the config is built, with a message naming the field and the fix."""

from __future__ import annotations

import dataclasses
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


# --- the field list, the help's choice lists and the docstring ---

def _registered():
    from fedhf.algorithms import ALGORITHMS
    from fedhf.corrections import CORRECTIONS
    from fedhf.data import PARTITION_KEYS, PARTITIONERS
    from fedhf.optim import LOCAL_OPTIMIZERS
    from fedhf.server import AGGREGATORS, SERVER_RULES, SERVER_TRANSFORMS
    from fedhf.sharing.plan import PRESETS
    from fedhf.sync import STATE_SYNCS

    return {"algorithm": ALGORITHMS.names(), "local_optimizer": LOCAL_OPTIMIZERS.names(),
            "correction": CORRECTIONS.names(), "state_sync": STATE_SYNCS.names(),
            "server_rule": SERVER_RULES.names() + AGGREGATORS.names() + SERVER_TRANSFORMS.names(),
            "parameter_sharing": list(PRESETS), "partition": list(PARTITIONERS), "partition_key": list(PARTITION_KEYS)}


@pytest.mark.parametrize("field_name, names", sorted(_registered().items()))
def test_every_registered_name_appears_in_its_fields_help(field_name, names):
    import re

    help_text = FederatedConfig.__dataclass_fields__[field_name].metadata["help"]
    missing = [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", help_text)]
    assert names and not missing, f"{field_name}'s help lacks {missing}: {help_text}"


def test_the_class_docstrings_document_every_field_fedhf_declares():
    """FederatedConfig and its bases from fedhf (the data split, compression, privacy and clock groups) each list the
    fields they declare."""
    declaring = [cls for cls in FederatedConfig.__mro__ if cls.__module__.startswith("fedhf.")]
    own = {cls.__name__: cls.__dict__["__annotations__"] for cls in declaring}
    undocumented = {cls.__name__: [name for name in own[cls.__name__] if name not in cls.__doc__] for cls in declaring}
    assert len(declaring) == 5 and sum(map(len, own.values())) > 60
    assert undocumented == {cls.__name__: [] for cls in declaring}


# --- the algorithm and the parameter sharing: built once, reused, never stale ---

def test_the_trainer_reuses_the_algorithm_the_config_built(tmp_path, digits, monkeypatch):
    from fedhf.trainer.config import federated_config as config_module
    from tests.helpers import config, digit_trainer, tiny_resnet

    builds = []
    compose = config_module.compose
    monkeypatch.setattr(config_module, "compose", lambda *a, **kw: builds.append(a) or compose(*a, **kw))
    args = config(tmp_path, algorithm="scaffold")
    trainer = digit_trainer(tiny_resnet(), digits, args, evaluate=False)
    assert len(builds) == 1  # one build: the config's, which checked the settings
    assert trainer.algorithm is args.built_algorithm() and trainer.sharing is args.built_sharing()


def test_a_field_changed_after_the_config_was_made_rebuilds_what_depends_on_it(tmp_path):
    cfg = _config(tmp_path, algorithm="fedprox", algorithm_kwargs={"mu": 0.01})
    first = cfg.built_algorithm()
    cfg.num_rounds, cfg.output_dir = 3, str(tmp_path / "elsewhere")  # nothing the algorithm is built from
    assert cfg.built_algorithm() is first
    cfg.algorithm_kwargs["mu"] = 0.5  # changed in place
    assert cfg.built_algorithm().correction.mu == 0.5
    cfg.algorithm, cfg.algorithm_kwargs = "scaffold", {}
    assert cfg.built_algorithm().correction.name == "control_variate"
    sharing = cfg.built_sharing()
    cfg.parameter_sharing = "personal_head"
    assert sharing.preset == "all" and cfg.built_sharing().preset == "personal_head"


@pytest.mark.parametrize("sft", [False, True])
def test_the_built_algorithm_stays_out_of_the_settings(tmp_path, sft):
    import dataclasses
    import json
    import pickle

    if sft:
        from fedhf import FederatedSFTConfig as cls
    else:
        cls = FederatedConfig
    cfg = cls(output_dir=str(tmp_path / "out"), report_to="none", algorithm="fedadam")
    assert cfg.built_algorithm().name == "fedadam"
    assert "_built" not in cfg.to_dict() and "_built" not in json.loads(cfg.to_json_string())
    other = dataclasses.replace(cfg, algorithm="fedavgm")
    assert other.built_algorithm().name == "fedavgm" and cfg.built_algorithm().name == "fedadam"
    copied = pickle.loads(pickle.dumps(cfg))  # as Trainer's training_args.bin
    assert "_built" not in vars(copied) and copied.to_dict() == cfg.to_dict()
    assert copied.built_algorithm().describe() == cfg.built_algorithm().describe()


def test_pin_memory_is_set_off_only_where_no_accelerator_is_present(tmp_path, monkeypatch):
    """Without an accelerator torch ignores pinning and warns on every loader; with one the setting is the user's."""
    import torch

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert _config(tmp_path).dataloader_pin_memory is False  # TrainingArguments' default True, use_cpu unset
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    assert _config(tmp_path).dataloader_pin_memory is True
    assert _config(tmp_path, dataloader_pin_memory=False).dataloader_pin_memory is False


def test_evaluation_on_a_machine_without_an_accelerator_shows_no_pin_memory_warning(tmp_path, digits):
    import warnings

    import torch

    from tests.helpers import config, digit_trainer, tiny_resnet

    if torch.accelerator.is_available():
        pytest.skip("checks a machine without an accelerator")
    trainer = digit_trainer(tiny_resnet(), digits, config(tmp_path, use_cpu=False, num_rounds=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = trainer.evaluate()
    assert "eval_loss" in metrics and not [str(w.message) for w in caught if "pin_memory" in str(w.message)]


def test_fedhf_train_help_groups_the_clock_fields_and_keeps_trainers_fields_with_trainer():
    """The clock's fields have their own group; a TrainingArguments field FederatedConfig gives a new default
    (logging_steps) is listed with TrainingArguments, not with the federation."""
    from fedhf.trainer.config.clock_settings import ClockSettings
    from fedhf.trainer.config.field_help import field_groups

    groups = field_groups()
    clock = [f.name for f in dataclasses.fields(ClockSettings)]
    assert groups["the simulated clock (docs/clock.md)"] == clock
    trainer = groups["TrainingArguments (honoured in rounds or refused)"]
    assert "logging_steps" in trainer and "logging_steps" not in groups["the federation and its algorithm"]
    assert not set(clock) & set(trainer)
    every = [n for names in groups.values() for n in names]
    assert len(every) == len(set(every))  # each field in one group


def test_fedhf_train_help_gives_every_settings_base_its_own_group(capsys):
    """Each *_settings base of FederatedConfig has a group holding exactly its fields (none filed with
    TrainingArguments or the federation), and the help prints every group."""
    from fedhf.cli import main
    from fedhf.trainer.config.field_help import TRAINING_ARGUMENTS_TITLE, field_groups, fields_help

    groups = field_groups()
    bases = FederatedConfig.settings_bases()
    assert {base.__name__ for base in bases} == {"ClockSettings", "PrivacySettings", "CompressionSettings",
                                                 "PartitionSettings"}
    others = set(groups[TRAINING_ARGUMENTS_TITLE]) | set(groups["the federation and its algorithm"])
    for base in bases:
        names = [f.name for f in dataclasses.fields(base)]
        assert names in groups.values(), base.__name__
        assert not set(names) & others, base.__name__
    assert len(groups) == len(bases) + 2
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    printed = capsys.readouterr().out
    assert fields_help() in printed and all(f"\n  {title}:\n" in printed for title in groups)
