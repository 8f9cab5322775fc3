"""The process world: one source for the client -> process map, and a refusal when it disagrees with the
TrainingArguments (the two-process runs themselves are in test_multiprocess.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fedhf.runtime.processes import (ProcessWorld, cpu_only_launch, launched_processes, process_world,
                                     value_of_the_main_process)


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


def _agree(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out.put((rank, value_of_the_main_process(1000 + rank)))  # each process drew its own value
    finally:
        dist.destroy_process_group()


def test_every_process_gets_the_main_process_value():
    """What only one process may draw (the privacy secret) is the same on every process: process 0's."""
    import socket

    import torch.multiprocessing as mp

    assert value_of_the_main_process(7) == 7  # no process group: as it is
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    out = context.Queue()
    processes = [context.Process(target=_agree, args=(rank, port, out)) for rank in range(2)]
    for p in processes:
        p.start()
    results = dict(out.get(timeout=120) for _ in processes)
    for p in processes:
        p.join(timeout=60)
    assert results == {0: 1000, 1: 1000}


def test_a_launch_that_started_fewer_processes_than_asked_is_named(monkeypatch):
    """`accelerate launch --num_processes 2` without --multi_gpu on a CPU starts one process and sets only
    MASTER_ADDR for the others; a launcher's WORLD_SIZE above torch.distributed's world is the same surprise."""
    from fedhf.runtime.processes import launch_mismatch

    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "MASTER_ADDR",
                 "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    assert launch_mismatch(ProcessWorld()) is None  # a plain 1-process run
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert launch_mismatch(ProcessWorld()) is None  # `accelerate launch` of one process
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert "--multi_gpu" in launch_mismatch(ProcessWorld())
    monkeypatch.delenv("MASTER_ADDR")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "asked for 2 processes" in launch_mismatch(ProcessWorld())
    assert launch_mismatch(ProcessWorld(1, 2)) is None


def test_the_process_line_names_the_count_and_the_modes():
    assert ProcessWorld(0, 2).describe() == ("2 processes (client_parallel: False, FSDP: False), clients spread by "
                                             "id mod 2")
    assert ProcessWorld(0, 1).describe().startswith("1 process (")
