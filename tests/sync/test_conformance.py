"""Every registered state-sync rule through the same checks (one suite per axis), with a real Theta (AMSGrad's v_hat
on a matrix whose gradients are rank one, so v_hat = g^2 is rank one too and a low-rank upload keeps it exactly):
identical clients hand the next round exactly their Theta (rules that warm-start) or nothing (reset), the broadcast
survives a safetensors round trip, the server half does not depend on client order, and only rules that really
send Theta count upload bytes. A registered rule missing from ``CASES`` fails the coverage test."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from fedhf.core.sums import RoundSums
from fedhf.core.context import ClientContext, ServerContext
from fedhf.optim import LocalOptimizer
from fedhf.core.client_store import ClientStateStore
from fedhf.sync import STATE_SYNCS

CASES = {"reset": {}, "persist_local": {}, "average_warmstart": {}, "compressed_average": {"fraction": 0.05},
         "desloc": {"first_moment_period": 1, "second_moment_period": 1}}
UPLOADS = {"average_warmstart", "compressed_average", "desloc"}  # the others send Theta only as a drift diagnostic (0 bytes)
OPTIMIZER = LocalOptimizer("amsgrad", {"lr": 0.01})
X0 = torch.zeros(4, 6)


def test_every_registered_component_is_in_the_conformance_list():
    assert set(STATE_SYNCS.names()) == set(CASES)


def _ctx(cid, store, sync_state, r=0, x0=X0):
    p = torch.nn.Parameter(x0.clone())
    return ClientContext(client_id=cid, round=r, round_lr=0.01, local_lr=0.01, local_steps=1, weight=1.0,
                         params={"w": p}, global_params={"w": x0}, correction_state={}, store=store,
                         sync_state=sync_state)


def _client(sync, cid, grad, store, sync_state, r=0, x0=X0):
    """One client round: build, import (client_begin), one step on ``grad``; returns (message, Theta, optimizer)."""
    ctx = _ctx(cid, store, sync_state, r, x0)
    optimizer = OPTIMIZER.build(ctx.params, ctx.local_lr)
    sync.client_begin(ctx, optimizer)
    ctx.params["w"].grad = grad.to(x0.dtype)
    optimizer.step()
    theta = _kept(sync, optimizer)
    return sync.client_end(ctx, theta, optimizer.theta_structure(theta)), theta


def _server(sync, messages, x0=X0):
    sums = RoundSums()
    for message in messages:
        sums.add_message(message, "sync")
    ctx = ServerContext(round=0, round_lr=0.01, local_steps=1, num_clients=3, sums=sums.within("sync"),
                        global_params={"w": x0}, mean_delta={"w": torch.zeros_like(x0)})
    return sync.server_update({}, ctx)


def _kept(sync, optimizer):
    """What the trainer hands the rule: Theta, or the whole state for rules that keep it (desloc)."""
    return optimizer.export_theta() if sync.moves == "theta" else optimizer.export_state()


def _rank_one(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.outer(torch.rand(4, generator=g) + 0.5, torch.rand(6, generator=g) + 0.5)


def _imported(sync, cid, store, sync_state):
    """The Theta a client starts its next round with (after client_begin, before any step)."""
    ctx = _ctx(cid, store, sync_state, r=1)
    optimizer = OPTIMIZER.build(ctx.params, ctx.local_lr)
    sync.client_begin(ctx, optimizer)
    return _kept(sync, optimizer)


@pytest.mark.parametrize("name", sorted(CASES))
def test_identical_clients_hand_the_next_round_their_theta(name):
    sync, store = STATE_SYNCS.get(name)(**CASES[name]), ClientStateStore()
    results = [_client(sync, cid, _rank_one(0), store, {}) for cid in (0, 1, 2)]
    theta = results[0][1]
    broadcast = _server(sync, [m for m, _ in results])
    imported = _imported(sync, 0, store, broadcast)
    if sync.carries_state:
        assert imported.keys() == theta.keys()
        for key in theta:
            torch.testing.assert_close(imported[key], theta[key], rtol=1e-5, atol=1e-9)
    else:
        assert imported == {} and broadcast == {}  # a fresh optimizer every round


@pytest.mark.parametrize("name", sorted(CASES))
def test_broadcast_is_order_free_and_survives_a_safetensors_round_trip(name):
    sync = STATE_SYNCS.get(name)(**CASES[name])
    messages = [_client(sync, cid, _rank_one(cid + 1), ClientStateStore(), {})[0] for cid in (0, 1, 2)]
    forward, backward = _server(sync, messages), _server(sync, messages[::-1])
    assert forward.keys() == backward.keys()
    for key in forward:
        torch.testing.assert_close(forward[key], backward[key], rtol=1e-6, atol=1e-9)
    reloaded = load(save(forward)) if forward else {}
    a, b = _imported(sync, 5, ClientStateStore(), forward), _imported(sync, 5, ClientStateStore(), reloaded)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", sorted(CASES))
def test_only_rules_that_send_theta_count_its_bytes(name):
    sync = STATE_SYNCS.get(name)(**CASES[name])
    message, theta = _client(sync, 0, _rank_one(3), ClientStateStore(), {})
    dense = sum(t.numel() * t.element_size() for t in theta.values())
    # the drift metric is not this axis's (fedhf/trainer/hooks/round_metrics.py): a rule sends only what it uses
    assert not any(key.startswith("theta_sq.") for key in message.tensors)
    if name in UPLOADS:
        assert 0 < message.nbytes <= dense
        # desloc averages the moments (AMSGrad's m and v), not the AMSGrad max
        assert ("theta.exp_avg:w" if name == "desloc" else "theta.max_exp_avg_sq:w") in message.tensors
    else:
        assert message.nbytes == 0
        assert not message.tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_broadcast_is_sent_in_the_clients_state_dtype(name, dtype):
    """The downlink counts the broadcast's bytes: a float64 average of float32 state would count twice its size.
    And a rule handed bf16 global parameters (the trainer hands float32 copies) must not round their float32 state
    (AMSGrad's, as every fedhf optimizer keeps a half-precision parameter's) to bf16."""
    sync, x0 = STATE_SYNCS.get(name)(**CASES[name]), X0.to(dtype)
    results = [_client(sync, cid, _rank_one(cid + 1), ClientStateStore(), {}, x0=x0) for cid in (0, 1, 2)]
    broadcast, theta = _server(sync, [m for m, _ in results], x0), results[0][1]
    assert (broadcast != {}) == (name in UPLOADS) and all(t.dtype == torch.float32 for t in theta.values())
    for key, tensor in broadcast.items():
        assert tensor.dtype == theta[key].dtype, key
