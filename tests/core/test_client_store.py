"""The client state store keeps state per client id and, beyond its budget, on disk as safetensors."""

from __future__ import annotations

import torch

from fedhf.core.client_store import ClientStateStore


def test_state_beyond_the_budget_goes_to_disk_and_comes_back_exactly(tmp_path):
    store = ClientStateStore(budget_bytes=3 * 1024, spill_dir=str(tmp_path))
    saved = {}
    for cid in range(10):
        saved[cid] = {"c": torch.randn(256)}  # 1 KiB each
        store.put(cid, "scaffold_c", saved[cid])
    assert store.resident_bytes <= 3 * 1024
    assert len(list(tmp_path.glob("*.safetensors"))) == 7
    for cid in range(10):
        assert torch.equal(store.get(cid, "scaffold_c")["c"], saved[cid]["c"])
    assert store.get(99, "scaffold_c") is None
    assert len(store) == 10


def test_overwriting_a_spilled_entry_removes_its_file(tmp_path):
    store = ClientStateStore(budget_bytes=1024, spill_dir=str(tmp_path))
    store.put(0, "s", {"c": torch.zeros(256)})
    store.put(1, "s", {"c": torch.ones(256)})  # pushes client 0 to disk
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    store.put(0, "s", {"c": torch.full((256,), 2.0)})
    assert torch.equal(store.get(0, "s")["c"], torch.full((256,), 2.0))
    assert torch.equal(store.get(1, "s")["c"], torch.ones(256))


def test_an_empty_state_is_no_state_and_the_clients_survive_a_checkpoint_round_trip(tmp_path):
    """A checkpoint (and Flower's Context.state) stores tensors: an entry without any would come back missing."""
    store = ClientStateStore(budget_bytes=1024, spill_dir=str(tmp_path))
    store.put(3, "state", {})  # SGD kept whole: nothing
    store.put(0, "s", {"c": torch.zeros(256)})
    store.put(1, "s", {"c": torch.ones(256)})  # client 0 spilled: still counted
    store.put(1, "s", {})  # and overwritten by nothing: forgotten
    assert store.clients() == {0} and store.get(3, "state") is None and store.get(1, "s") is None
    again = ClientStateStore()
    again.load_tensors(store.to_tensors())
    assert again.clients() == store.clients()


def test_a_run_with_a_small_budget_spills_and_matches_the_unlimited_run(digits, tmp_path):
    from tests.helpers import config, digit_trainer, tiny_resnet, trainable_state

    def run(name, budget_mb):
        model = tiny_resnet()
        args = config(tmp_path / name, algorithm="scaffold", num_clients=30, clients_per_round=10, num_rounds=4,
                      local_steps=1, partition="iid", client_state_budget_mb=budget_mb)
        trainer = digit_trainer(model, digits, args, evaluate=False)
        trainer.train()
        return trainer, trainable_state(model)

    state_size = sum(p.numel() * 4 for p in tiny_resnet().parameters())
    budget_mb = 3 * state_size / 2**20  # room for 3 clients' c_i
    limited, limited_model = run("limited", budget_mb)
    unlimited, unlimited_model = run("unlimited", None)
    assert limited.client_store.resident_bytes <= budget_mb * 2**20
    assert len(limited.client_store) == len(unlimited.client_store) > 20
    assert len(list((tmp_path / "limited" / "run" / "client_state").glob("*.safetensors"))) >= 17
    assert all(torch.equal(limited_model[n], unlimited_model[n]) for n in unlimited_model)
