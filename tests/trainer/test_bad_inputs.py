"""Each bad input in tests/trainer/bad_inputs.py is refused before any work, naming its field, writing nothing; and
docs/bad_inputs.md is exactly the table generated from them."""

from __future__ import annotations

import pathlib

import pytest

from tests.trainer.bad_inputs import BAD_INPUTS
from tests.trainer.bad_inputs_table import DOC, render, refusal


def _env(request, tmp_path):
    env = {"tmp_path": tmp_path}
    for name in ("digits", "tweets", "tokenizer", "minilm"):
        env[name] = request.getfixturevalue(name)
    return env


def test_there_are_at_least_forty_bad_inputs():
    assert len(BAD_INPUTS) >= 40
    assert len({b.input for b in BAD_INPUTS}) == len(BAD_INPUTS)


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[b.input for b in BAD_INPUTS])
def test_bad_input_is_refused_before_work_naming_the_field(bad, request, tmp_path):
    env = _env(request, tmp_path)
    message = refusal(bad, env)
    assert bad.field in message
    run = tmp_path / "run"
    assert not run.exists() or run.is_file() or not any(run.iterdir())  # nothing written


def test_docs_bad_inputs_is_generated_from_the_tests(request, tmp_path_factory):
    messages = [refusal(b, _env(request, tmp_path_factory.mktemp("doc"))) for b in BAD_INPUTS]
    assert pathlib.Path(DOC).read_text() == render(BAD_INPUTS, messages), \
        "docs/bad_inputs.md is stale: regenerate it with `python -m tests.trainer.bad_inputs_table`"
