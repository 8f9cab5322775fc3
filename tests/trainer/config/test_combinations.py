"""The refusal table (fedhf/trainer/config/combinations/): a row that needs the settings only refuses when the
config is made, and again when the trainer is built (a field changed in between); a row that needs the trainer
refuses when the trainer is built; a settings row cannot read the trainer."""

from __future__ import annotations

import pytest

from fedhf.trainer.config.combinations import COMBINATIONS, SETTINGS, TRAINER, Setup, check_setting_combinations

from tests.helpers import config, digit_trainer, tiny_resnet

DP = dict(dp_mode="central", dp_clip_norm=1.0, dp_noise_multiplier=1.0)


def test_every_row_declares_settings_or_trainer_and_both_kinds_exist():
    assert {row.needs for row in COMBINATIONS} == {SETTINGS, TRAINER}


def test_a_settings_row_refuses_when_the_config_is_made(tmp_path):
    with pytest.raises(ValueError, match="`drift_spectral` reads every client's optimizer state, which DP does not"):
        config(tmp_path, drift_spectral=True, **DP)
    with pytest.raises(ValueError, match="`clients_per_round`=5 exceeds `num_clients`=4"):
        config(tmp_path, clients_per_round=5)
    assert not (tmp_path / "run").exists()


def test_a_field_changed_after_the_config_was_made_is_refused_by_the_trainer(tmp_path, digits):
    args = config(tmp_path)
    check_setting_combinations(args)  # valid as made
    args.personalized_eval = True  # without client_eval_fraction
    with pytest.raises(ValueError, match="`personalized_eval` evaluates each client on its held-out rows"):
        check_setting_combinations(args)
    with pytest.raises(ValueError, match="`personalized_eval` evaluates each client on its held-out rows"):
        digit_trainer(tiny_resnet(), digits, args)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())  # nothing written


def test_a_trainer_row_refuses_only_when_the_trainer_is_built(tmp_path, digits):
    """DP with BatchNorm buffers is known from the model alone: the config is valid, the trainer refuses."""
    args = config(tmp_path, **DP)
    with pytest.raises(ValueError, match="averaged buffers.*BatchNorm"):
        digit_trainer(tiny_resnet(), digits, args)


def test_a_settings_row_cannot_read_the_trainer(tmp_path):
    s = Setup(None, config(tmp_path))
    assert s.args.num_clients == 4
    with pytest.raises(AttributeError, match="needs=SETTINGS"):
        s.model
