"""Which optimizer state is shared, kept or reset, per named algorithm (docs/algorithms.md 4.3), seen
from inside the real trainer: the Theta every client starts its round with, against the Theta the clients ended the
previous rounds with. 3 clients, 2 per round, 3 rounds, so a client's own state is older than the last average.

* average (FedPAC, FedMuon, FedLADA, PreFed): round r starts from the mean of round r-1's final Theta;
* compressed (the _light / _svd variants): the mean of each client's low-rank reconstruction;
* persist (Fed-Sophia, FedPM, LocalNewton, FAdam): each client from its own last final Theta, never the mean;
* reset (Local X): from nothing.
"""

from __future__ import annotations

import pytest
import torch

from tests.pinned.pinning import build

POLICY = {
    "fedpac_muon": "average", "fedmuon": "average", "fedpac_soap": "average", "fedpac_sophia": "average",
    "fedlada": "average", "prefed": "average",
    "fedpac_soap_light": "compressed",  # 2 x 2 factors at c = 0.1: rank 1 (3 floats) beats dense (4)
    "fedpac_muon_light": "average", "fedmuon_svd": "average", "fedpac_sophia_light": "average",  # 2x2 stays dense
    "fed_sophia": "persist", "fedpm": "persist", "localnewton": "persist", "fadam_et": "persist", "fadam_gt": "persist",
    "local_adamw": "reset", "local_muon": "reset", "local_soap": "reset", "local_sophia": "reset",
}


def record_theta(monkeypatch, trainer):
    """{(round, client): Theta at the start of its round, after the state-sync import} and the same at the end."""
    sync, starts, ends = trainer.algorithm.state_sync, {}, {}
    begin, end = sync.client_begin, sync.client_end

    def client_begin(ctx, optimizer):
        begin(ctx, optimizer)
        starts[ctx.round, ctx.client_id] = optimizer.export_theta()

    def client_end(ctx, theta, kinds=None):
        ends[ctx.round, ctx.client_id] = {k: t.clone() for k, t in theta.items()}
        return end(ctx, theta, kinds)

    monkeypatch.setattr(sync, "client_begin", client_begin)
    monkeypatch.setattr(sync, "client_end", client_end)
    return starts, ends


def top_eigen(M):
    """The rank-1 truncation of a symmetric 2 x 2 factor: its eigenpair of largest |eigenvalue| (docs/algorithms.md 2.9d)."""
    values, vectors = torch.linalg.eigh(M.double())
    j = int(values.abs().argmax())
    return (values[j] * torch.outer(vectors[:, j], vectors[:, j])).float()


def mean_of(thetas, transform=lambda key, t: t):
    return {k: sum(transform(k, th[k]) for th in thetas) / len(thetas) for k in thetas[0]}


def assert_same(a, b):
    assert a.keys() == b.keys() and a
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-7, msg=k)


def differs(a, b):
    return any(not torch.allclose(a[k], b[k], rtol=1e-3, atol=1e-6) for k in a)


@pytest.mark.parametrize("name", sorted(POLICY))
def test_state_is_shared_kept_or_reset_as_the_algorithm_says(tmp_path, monkeypatch, name):
    kwargs = {"algorithm_kwargs": {"hess_interval": 1}} if "sophia" in name else {}
    trainer = build(tmp_path, name, rounds=3, local_steps=2, num_clients=3, per_round=2, learning_rate=0.01, **kwargs)
    starts, ends = record_theta(monkeypatch, trainer)
    trainer.train()
    policy, last, checked = POLICY[name], {}, 0
    for r in range(3):
        clients = sorted(c for (rr, c) in starts if rr == r)
        previous = [ends[r - 1, c] for c in sorted(c for (rr, c) in ends if rr == r - 1)] if r else []
        for c in clients:
            start = starts[r, c]
            assert ends[r, c], "the optimizer has a Theta at the end of its round"
            if policy == "reset" or r == 0 or (policy == "persist" and c not in last):
                assert start == {}, f"round {r} client {c} should start fresh"
                continue
            if policy == "persist":
                assert_same(start, last[c])
                assert differs(start, mean_of(previous)) or c not in [cc for (rr, cc) in ends if rr == r - 1]
            elif policy == "average":
                assert_same(start, mean_of(previous))
            else:  # compressed: symmetric factors keep their top eigenpair
                assert_same(start, mean_of(previous, lambda key, t: top_eigen(t) if t.ndim == 2 else t))
                assert differs(start, mean_of(previous))
            if policy != "persist":
                assert differs(start, last.get(c, previous[0]))  # the mean is not the client's own state
            checked += 1
        last.update({c: ends[r, c] for c in clients})
    assert checked >= (0 if policy == "reset" else 2)
