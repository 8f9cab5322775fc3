"""A feature cannot land without its declaration in the interaction matrix (fedhf/interactions/features.py)."""

from __future__ import annotations

import dataclasses

from transformers import TrainingArguments

from fedhf import FederatedConfig
from fedhf.interactions.features import HISTORY_KEYS, MUST_REFUSE, PARAMETERS, covered_fields, features, undeclared
from fedhf.interactions.matrix import EQUAL, STATISTICAL, TRAINS, alone, pairs
from fedhf.interactions.oracles import PROPERTIES


def test_every_registry_entry_is_declared():
    assert undeclared() == []


def test_every_federated_config_field_is_a_feature_or_a_parameter_of_one():
    trainer_fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in dataclasses.fields(FederatedConfig)} - trainer_fields
    assert sorted(own - covered_fields()) == []
    assert sorted(set(PARAMETERS) - own) == []  # no stale entry


def test_declarations_name_real_oracles_and_partners():
    names = {f.name for f in features()}
    assert len(names) == len(features())
    for f in features():
        assert f.statistical is None or f.statistical in PROPERTIES, f.name
        if f.twin is not None:
            assert set(f.twin.partners) <= names, f.name
            assert f.twin.source and f.twin.rtol >= 0 and f.twin.atol >= 0, f.name
    assert set(MUST_REFUSE) <= {f.name for f in alone()}
    assert "train_loss" in HISTORY_KEYS


def test_the_matrix_has_enough_pairs_and_trains_is_the_smallest_oracle_by_declaration():
    chosen = [p.choice()[0] for p in pairs()]
    assert len(chosen) >= 150
    assert chosen.count(EQUAL) + chosen.count(STATISTICAL) > 0
    assert set(chosen) <= {EQUAL, STATISTICAL, TRAINS}
