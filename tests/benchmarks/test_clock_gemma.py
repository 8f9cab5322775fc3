"""benchmarks/clock_gemma.py against its stored runs: its task is its own (not whatever the LLM comparison's budget
becomes), so the committed seed-0 runs are reused, and a new run evaluates after every server update, which its
report (accuracy against simulated time) reads from the history."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.importing import BENCHMARKS, import_benchmark


@pytest.fixture(scope="module")
def clock_gemma():
    return import_benchmark("clock_gemma")


def test_the_stored_runs_are_reused_under_the_current_settings(clock_gemma):
    from algorithm_runs import cached

    for name, variant in clock_gemma.VARIANTS.items():
        path = BENCHMARKS / "clock_gemma_runs" / name / "seed0.json"
        settings = {**clock_gemma.TASK, "algorithm": f"{variant}@clock_budget_s=120.0", "seed": 0}  # as main()
        assert cached(str(path), settings) is not None, (name, json.load(open(path))["settings"], settings)
        record = json.load(open(path))
        assert all("eval_generation_accuracy" in entry for entry in record["history"])  # what the report reads


def test_a_run_evaluates_after_every_server_update(clock_gemma, tmp_path):
    settings = {**clock_gemma.TASK, "algorithm": f"{clock_gemma.VARIANTS['sync']}@clock_budget_s=120.0", "seed": 0}
    args = clock_gemma.trainer_args(settings, str(tmp_path))
    assert args.eval_on_start and args.eval_every_rounds == 1 and args.num_rounds == clock_gemma.MAX_ROUNDS
    assert args.per_device_train_batch_size == 8 and args.local_steps == 3 and args.clock_budget_s == 120.0
