"""The round's messages and their sums: a weighted message adds up to the hand-computed weighted sum, each component
reads only its own namespace, a key nobody sent is an error, and bytes are what the message says it sends."""

from __future__ import annotations

import pytest
import torch

from fedhf.core.message import Message
from fedhf.core.sums import MissingSum, RoundSums


def test_weighted_messages_add_to_the_weighted_sum_in_float64():
    sums = RoundSums()
    updates = [(0.25, torch.tensor([1.0, -2.0])), (0.75, torch.tensor([3.0, 4.0]))]
    for weight, delta in updates:
        sums.add_message(Message().put("dx", {"w": delta}, scale=weight).put_scalar("w", weight))
    assert sums.get("dx.w").dtype == torch.float64
    assert torch.equal(sums.get("dx.w"), torch.tensor([0.25 * 1 + 0.75 * 3, 0.25 * -2 + 0.75 * 4], dtype=torch.float64))
    assert sums.scalar("w") == 1.0


def test_each_component_reads_its_own_namespace_and_a_missing_key_raises():
    sums = RoundSums()
    sums.add_message(Message().put("c", {"w": torch.ones(2)}), "correction")
    sums.add_message(Message().put("theta", {"w": 2 * torch.ones(2)}), "sync")
    correction = sums.within("correction")
    assert correction.keys() == ["c.w"]
    assert torch.equal(correction.tensors("c", {"w": torch.zeros(2)})["w"], torch.ones(2))
    with pytest.raises(MissingSum, match="theta.w"):
        correction.get("theta.w")
    assert sums.has("sync") and not sums.has("server")


def test_bytes_are_the_dense_size_unless_the_sender_says_less():
    dense = Message().put("dx", {"w": torch.zeros(3, 4)})
    assert dense.nbytes == 3 * 4 * 4
    low_rank = Message().put("theta", {"w": torch.zeros(3, 4)}, nbytes=7 * 4)
    assert low_rank.nbytes == 28
    assert Message().put_scalar("w", 1.0).nbytes == 0


def test_gathered_updates_come_back_in_client_order_whatever_order_they_arrived():
    sums = RoundSums()
    for cid in (5, 1, 3):
        sums.gather(cid, {"w": torch.full((1,), float(cid))})
    assert [u["w"].item() for u in sums.gathered_in_client_order()] == [1.0, 3.0, 5.0]
