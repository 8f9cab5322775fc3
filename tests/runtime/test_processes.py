"""The process world: one source for the client -> process map, and a refusal when it disagrees with the
TrainingArguments (the two-process runs themselves are in test_multiprocess.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fedhf.runtime.processes import ProcessWorld, cpu_only_launch, launched_processes, process_world


def test_client_map_covers_every_client_once():
    clients = list(range(11))
    worlds = [ProcessWorld(rank, 3) for rank in range(3)]
    shares = [w.clients_of_this_process(clients) for w in worlds]
    assert sorted(c for share in shares for c in share) == clients
    assert shares[1] == [1, 4, 7, 10]


def test_single_process_world_matches_plain_arguments():
    assert process_world(SimpleNamespace(world_size=1, process_index=0)) == ProcessWorld(0, 1)


def test_disagreeing_arguments_are_refused_naming_use_cpu():
    # torch.distributed is not initialised here (a world of 1) while the arguments claim 2 processes.
    with pytest.raises(RuntimeError, match="use_cpu=True"):
        process_world(SimpleNamespace(world_size=2, process_index=1))


@pytest.mark.parametrize("env,expected", [({}, 1), ({"WORLD_SIZE": "2"}, 2), ({"OMPI_COMM_WORLD_SIZE": "4"}, 4)])
def test_launched_processes_reads_the_launcher(monkeypatch, env, expected):
    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert launched_processes() == expected


def test_cpu_only_launch_needs_several_processes_and_no_gpu(monkeypatch):
    import torch

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cpu_only_launch() is (not torch.cuda.is_available())
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cpu_only_launch() is False
