"""Every registered correction through the same checks (issue 10 item 6): a round without gradient is a fixed point
of the client and the server halves, the server state survives a safetensors round trip, and the server half does
not depend on the order in which clients are summed. Clients run the trainer's hook order (clip, ``before_step``,
an SGD step at ``round_lr * lr_scale``, ``after_step``) on one tensor. tests/server/test_conformance.py fails when a
registered correction is missing from ``CASES``."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from fedhf.aggregation import RoundSums
from fedhf.context import ClientContext, ServerContext
from fedhf.corrections import CORRECTIONS
from fedhf.state import ClientStateStore

# kwargs that make each correction act (non-zero mixing / proximal weights)
CASES = {"none": {}, "proximal": {"mu": 0.3}, "control_variate": {}, "global_mix": {"beta": 0.5},
         "control_variate_post": {"tracked_fraction": 1.0}, "gradient_tracking": {"tracked_fraction": 1.0}}
X0 = torch.tensor([1.0, -2.0, 0.5])
N, K, ROUND_LR = 4, 2, 0.1


def test_every_registered_component_is_in_the_conformance_list():
    assert set(CORRECTIONS.names()) == set(CASES)


def _round(correction, state, grads_by_client, store, order=None, r=0):
    """One round; returns (the new server state, each client's final parameters)."""
    participants = list(grads_by_client)
    sums, finals = RoundSums(), {}
    for cid in order or participants:
        p = torch.nn.Parameter(X0.clone())
        ctx = ClientContext(client_id=cid, round=r, round_lr=ROUND_LR, local_lr=ROUND_LR * correction.lr_scale,
                            local_steps=K, weight=1.0, params={"w": p}, global_params={"w": X0},
                            correction_state=state, store=store, participants=participants, num_clients=N)
        correction.client_begin(ctx)
        for g in grads_by_client[cid]:
            p.grad = g.clone()
            correction.before_step(ctx)
            with torch.no_grad():
                p.add_(p.grad, alpha=-ctx.local_lr)
            correction.after_step(ctx)
        sums.add_message(correction.client_end(ctx), "correction")
        sums.add_tensors("dx", {"w": p.detach() - X0})
        sums.add("w", 1.0)
        finals[cid] = p.detach().clone()
    mean_delta = {"w": sums.tensors("dx", {"w": X0})["w"] / sums.scalar("w")}
    server = ServerContext(round=r, round_lr=ROUND_LR, local_steps=K, num_clients=N, sums=sums.within("correction"),
                           global_params={"w": X0}, mean_delta=mean_delta)
    return correction.server_update(state, server), finals


def _grads(seed):
    g = torch.Generator().manual_seed(seed)
    return {cid: [torch.randn(3, generator=g) for _ in range(K)] for cid in (2, 0, 3)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_round_without_gradient_is_a_fixed_point(name):
    correction = CORRECTIONS.get(name)(**CASES[name])
    state = correction.server_init({"w": X0})
    new_state, finals = _round(correction, state, {cid: [torch.zeros(3)] * K for cid in (0, 1)}, ClientStateStore())
    assert all(torch.equal(p, X0) for p in finals.values())
    assert new_state.keys() == state.keys()
    assert all(torch.equal(new_state[k], state[k]) for k in state)


@pytest.mark.parametrize("name", sorted(CASES))
def test_server_half_does_not_depend_on_client_order(name):
    correction = CORRECTIONS.get(name)(**CASES[name])
    state = correction.server_init({"w": X0})
    forward, finals_f = _round(correction, state, _grads(0), ClientStateStore())
    backward, finals_b = _round(correction, state, _grads(0), ClientStateStore(), order=[3, 0, 2])
    assert forward.keys() == backward.keys()
    for key in forward:
        torch.testing.assert_close(forward[key], backward[key], rtol=1e-6, atol=1e-7)
    for cid in finals_f:
        assert torch.equal(finals_f[cid], finals_b[cid])


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_round_trip_through_safetensors_changes_nothing(name):
    correction = CORRECTIONS.get(name)(**CASES[name])
    store = ClientStateStore()
    state, _ = _round(correction, correction.server_init({"w": X0}), _grads(1), store)
    reloaded = load(save({k: v.contiguous() for k, v in state.items()})) if state else {}
    store_copy = ClientStateStore()  # the per-client state as the checkpoint keeps it
    store_copy.load_tensors(load(save(store.to_tensors())))
    a_state, a_finals = _round(correction, state, _grads(2), store, r=1)
    b_state, b_finals = _round(correction, reloaded, _grads(2), store_copy, r=1)
    assert all(torch.equal(a_state[k], b_state[k]) for k in a_state) and a_state.keys() == b_state.keys()
    assert all(torch.equal(a_finals[c], b_finals[c]) for c in a_finals)
