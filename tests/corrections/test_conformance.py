"""Every registered correction through the same checks (one suite per axis): a round without gradient is a fixed point
of the client and the server halves, the server state survives a safetensors round trip, the server half does
not depend on the order in which clients are summed, a tensor frozen for a round (RoLoRA) leaves every correction
state of it unchanged, and a component a client does not train (``lora_client_ranks``) contributes nothing.
Clients run the trainer's hook order (``client_begin``'s state handed back to: clip, ``before_step``, an SGD step at ``round_lr * lr_scale``,
``after_step``) on one tensor (two for the trained-part checks). tests/server/test_conformance.py fails when a
registered correction is missing from ``CASES``."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from fedhf.core.sums import RoundSums
from fedhf.core.context import ClientContext, ServerContext, TrainedPart
from fedhf.corrections import CORRECTIONS
from fedhf.core.client_store import ClientStateStore

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
        mine = correction.client_begin(ctx)
        for g in grads_by_client[cid]:
            p.grad = g.clone()
            correction.before_step(ctx, mine)
            with torch.no_grad():
                p.add_(p.grad, alpha=-ctx.local_lr)
            correction.after_step(ctx, mine)
        sums.add_message(correction.client_end(ctx, mine), "correction")
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


# Two tensors for the trained-part checks: "w" always trained, "v" frozen for a round or trained in part (a 2 x 3
# "rank" layout: row j is component j, as A's rows under lora_client_ranks).
GLOBAL = {"w": X0, "v": torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])}
ROW0 = torch.tensor([[1.0], [0.0]])  # a client that trains component 0 only


def _truncate(params, part):
    """What ClientRanks does: the components a client lacks are zero at its start and after every step."""
    with torch.no_grad():
        for name, mask in part.masks.items():
            params[name].mul_(mask)


def _parts_round(correction, state, grads_by_client, store, parts, frozen=frozenset(), trainers=None, r=0):
    """One round over GLOBAL; ``parts[cid]`` is what client cid trains. Returns the new server state."""
    participants = list(grads_by_client)
    sums = RoundSums()
    for cid in participants:
        part = parts.get(cid, TrainedPart(frozen))
        params = {n: torch.nn.Parameter(t.clone(), requires_grad=n not in part.frozen) for n, t in GLOBAL.items()}
        _truncate(params, part)
        ctx = ClientContext(client_id=cid, round=r, round_lr=ROUND_LR, local_lr=ROUND_LR * correction.lr_scale,
                            local_steps=K, weight=1.0, params=params, global_params=GLOBAL, correction_state=state,
                            store=store, participants=participants, num_clients=N, trained=part)
        mine = correction.client_begin(ctx)
        for g in grads_by_client[cid]:
            for n, p in params.items():
                p.grad = None if n in part.frozen else g[n].clone()
            correction.before_step(ctx, mine)
            with torch.no_grad():
                for p in params.values():
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-ctx.local_lr)
            correction.after_step(ctx, mine)
            _truncate(params, part)
        assert all(torch.equal(params[n], GLOBAL[n]) for n in part.frozen)  # nothing moves a frozen tensor
        sums.add_message(correction.client_end(ctx, mine), "correction")
        sums.add_tensors("dx", {n: p.detach() - GLOBAL[n] for n, p in params.items()})
        sums.add("w", 1.0)
    mean_delta = {n: t / sums.scalar("w") for n, t in sums.tensors("dx", GLOBAL).items()}
    server = ServerContext(round=r, round_lr=ROUND_LR, local_steps=K, num_clients=N, sums=sums.within("correction"),
                           global_params=GLOBAL, mean_delta=mean_delta, frozen=frozen, trainers=trainers or {})
    return correction.server_update(state, server)


def _parts_grads(seed, clients=(2, 0, 3)):
    g = torch.Generator().manual_seed(seed)
    return {cid: [{n: torch.randn(t.shape, generator=g) for n, t in GLOBAL.items()} for _ in range(K)]
            for cid in clients}


def _of_v(tensors):
    """The entries of a server state ("c.v") or of the client store ("<client>/<entry>/v") that belong to v."""
    return {k: t for k, t in tensors.items() if k.endswith(".v") or k.endswith("/v")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_frozen_tensor_leaves_the_correction_state_unchanged(name):
    """RoLoRA: v trains in round 0 and is frozen in round 1; its zero change is not a zero gradient, so c, c_i,
    g_G, y and y_i of v stay exactly as round 0 left them."""
    correction = CORRECTIONS.get(name)(**CASES[name])
    store = ClientStateStore()
    trained = _parts_round(correction, correction.server_init(GLOBAL), _parts_grads(3), store, {})
    kept_store = {k: t.clone() for k, t in _of_v(store.to_tensors()).items()}
    if correction.carries_state:  # round 0 left state for v: "unchanged" below is not "still zero"
        assert any(t.abs().sum() > 0 for t in _of_v(trained).values())
    frozen = _parts_round(correction, trained, _parts_grads(4), store, {}, frozen=frozenset({"v"}), r=1)
    assert frozen.keys() == trained.keys()
    assert all(torch.equal(frozen[k], trained[k]) for k in _of_v(trained))
    assert _of_v(store.to_tensors()).keys() == kept_store.keys()
    assert all(torch.equal(store.to_tensors()[k], t) for k, t in kept_store.items())
    if correction.carries_state:  # while w's state moved on
        assert any(not torch.equal(frozen[k], trained[k]) for k in trained if k not in _of_v(trained))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_truncated_component_contributes_nothing(name):
    """lora_client_ranks: client 0 trains only component 0 of v (3 of the N = 4 clients train component 1). Its
    truncation of component 1 is neither a step nor a gradient: the server state of component 1 is what the round
    would give without client 0, and client 0's own state there stays as it was."""
    correction = CORRECTIONS.get(name)(**CASES[name])
    trainers = {"v": torch.tensor([[float(N)], [N - 1.0]])}
    full = TrainedPart(masks={"v": torch.ones(2, 1)})
    parts = {0: TrainedPart(masks={"v": ROW0}), 2: full, 3: full}
    grads = _parts_grads(5)  # client 0 gets a gradient on component 1 too: the correction must not use it
    state = correction.server_init(GLOBAL)
    with_0 = _parts_round(correction, state, grads, store := ClientStateStore(), parts, trainers=trainers)
    without_0 = _parts_round(correction, state, {c: g for c, g in grads.items() if c != 0}, ClientStateStore(), parts,
                             trainers=trainers)
    for key in _of_v(with_0):
        torch.testing.assert_close(with_0[key][1], without_0[key][1], rtol=1e-6, atol=1e-7)
        if correction.carries_state:  # the others' component 1 is in it
            assert with_0[key][1].abs().sum() > 0
    for key, t in _of_v(store.to_tensors()).items():
        if key.startswith("0/"):  # client 0's own state of component 1: still the initial zero
            assert torch.equal(t[1], torch.zeros(3))
