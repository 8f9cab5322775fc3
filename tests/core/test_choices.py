"""Every choice-valued field answers a typo with its closest choice, as the command line does for a flag."""

from __future__ import annotations

import pytest

from fedhf import FederatedConfig
from fedhf.core.choices import not_one_of

TYPOS = [("partition", "dirichlett", "dirichlet"), ("round_policy", "deadlin", "deadline"),
         ("local_optimizer", "muonn", "muon"), ("client_sampling", "poison", "poisson"), ("dp_mode", "centrl", "central"),
         ("dp_accountant", "rdpp", "rdp"), ("round_lr_schedule", "cosin", "cosine"), ("parameter_sharing", "fa", "ffa"),
         ("client_weighting", "num_sample", "num_samples"), ("clock_profile", "lognormel", "lognormal"),
         ("state_sync", "persist_locl", "persist_local"), ("algorithm", "scafold", "scaffold")]


@pytest.mark.parametrize("field,typo,meant", TYPOS)
def test_a_typo_in_a_choice_field_names_the_closest_choice(tmp_path, field, typo, meant):
    with pytest.raises(ValueError, match=rf"(?i)did you mean '{meant}'\?"):
        FederatedConfig(output_dir=str(tmp_path), report_to="none", **{field: typo})


def test_a_value_close_to_nothing_gets_no_guess():
    assert not_one_of("dp_mode", "xyz", ("off", "central")) == "`dp_mode` must be one of ('off', 'central'), got 'xyz'"
