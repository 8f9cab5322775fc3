"""full_determinism=True fixes torch's thread count to 1 in every process; the count is recorded."""

from __future__ import annotations

import json

import torch

from tests.helpers import config, digit_trainer, tiny_resnet


def test_full_determinism_sets_one_thread_and_the_count_is_recorded(digits, tmp_path):
    before = torch.get_num_threads()
    try:
        trainer = digit_trainer(tiny_resnet(), digits, config(tmp_path, num_rounds=1, local_steps=1,
                                                              full_determinism=True), evaluate=False)
        assert torch.get_num_threads() == 1
        trainer.train()
        assert json.loads((tmp_path / "run" / "partition.json").read_text())["torch_threads"] == 1
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(False)
