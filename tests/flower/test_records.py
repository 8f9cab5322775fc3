"""Tensors cross as Flower records bit for bit, and a round's sums rebuilt from per-client records equal the sums
of the same messages added in one process."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402

from fedhf.core.message import Message  # noqa: E402
from fedhf.core.sums import RoundSums  # noqa: E402
from fedhf.flower.records import (add_client_sums, flatten_groups, from_record, sums_tensors, to_record,  # noqa: E402
                                  unflatten_groups)


def test_every_dtype_comes_back_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    tensors = {"f32": torch.randn(3, 4, generator=g), "f64": torch.randn(5, generator=g, dtype=torch.float64),
               "bf16": torch.randn(2, 3, generator=g).to(torch.bfloat16), "i64": torch.arange(4),
               "scalar": torch.tensor(1.5, dtype=torch.float64), "a/b.c": torch.ones(1)}
    back = from_record(*to_record(tensors))
    assert sorted(back) == sorted(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape, name
        assert torch.equal(back[name], tensor), name


def test_groups_flatten_and_come_back():
    groups = {"global_params": {"x.weight": torch.ones(2)}, "sync_state": {"m/v": torch.zeros(1)}}
    back = unflatten_groups(flatten_groups(groups), ["global_params", "sync_state", "base_params"])
    assert back["base_params"] == {} and torch.equal(back["sync_state"]["m/v"], torch.zeros(1))


def _message(seed: int) -> Message:
    g = torch.Generator().manual_seed(seed)
    delta = {"w": torch.randn(4, 3, generator=g)}
    return Message().put("dx", delta, scale=1.0 + seed / 3).put_scalar("w", 1.0 + seed / 3).put_scalar("n", 1.0)


def test_per_client_sums_added_in_client_order_equal_one_process_sums():
    """What the server rebuilds from each node's per-client records is the simulation's RoundSums, exactly."""
    direct = RoundSums()
    rebuilt = RoundSums()
    for cid in range(5):
        message = _message(cid)
        direct.add_message(message)
        direct.gather(cid, {"w": message.tensors["dx.w"].float()})
        own = RoundSums()  # what a node sends for this client
        own.add_message(message)
        own.gather(cid, {"w": message.tensors["dx.w"].float()})
        add_client_sums(rebuilt, cid, from_record(*to_record(sums_tensors(own))))
    assert sorted(direct.keys()) == sorted(rebuilt.keys())
    for key in direct.keys():
        assert torch.equal(direct.get(key), rebuilt.get(key)), key
    assert [c for c, _ in rebuilt.gathered] == list(range(5))
    for (_, a), (_, b) in zip(direct.gathered, rebuilt.gathered):
        assert torch.equal(a["w"], b["w"]) and a["w"].dtype == b["w"].dtype
