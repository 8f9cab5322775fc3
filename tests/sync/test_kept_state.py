"""Rules that keep the optimizer's whole state (persist_local with keep="state", desloc), against hand computations:
a client whose inner AdamW / Muon state is kept steps exactly as one optimizer that was never rebuilt (DiLoCo's and
MuLoCo's workers); DES-LOC with every period 1 is Local Adam (parameters and both moments averaged every round),
written out here with torch's AdamW; and DES-LOC uploads each moment only at its own period."""

from __future__ import annotations

import pytest
import torch

from fedhf.algorithms import get_algorithm
from fedhf.core.client_store import ClientStateStore
from fedhf.core.context import ClientContext, ServerContext
from fedhf.core.sums import RoundSums
from fedhf.optim import LocalOptimizer
from fedhf.sync import DesLoc, PersistLocal, Reset

SHAPE = (3, 4)


def _grads(seed, steps):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(SHAPE, generator=g, dtype=torch.float64) for _ in range(steps)]


def _ctx(cid, r, params, store, sync_state):
    return ClientContext(client_id=cid, round=r, round_lr=0.01, local_lr=0.01, local_steps=1, weight=1.0,
                         params=params, global_params={k: v.detach().clone() for k, v in params.items()},
                         correction_state={}, store=store, sync_state=sync_state)


def _client_round(sync, local, cid, r, x, grads, store, sync_state):
    """One client round through the rule's protocol: build a fresh optimizer at x, client_begin, the steps (the
    gradient of 0.5 ||w - target||^2 with the given targets), client_end. Returns (w, message)."""
    params = {"w": torch.nn.Parameter(x.clone())}
    ctx = _ctx(cid, r, params, store, sync_state)
    optimizer = local.build(params, 0.01)
    sync.client_begin(ctx, optimizer)
    for target in grads:
        params["w"].grad = params["w"].detach() - target
        optimizer.step()
    kept = optimizer.export_theta() if sync.moves == "theta" else optimizer.export_state()
    return params["w"].detach().clone(), sync.client_end(ctx, kept)


def _server(sync, messages, x):
    sums = RoundSums()
    for message in messages:
        sums.add_message(message, "sync")
    ctx = ServerContext(round=0, round_lr=0.01, local_steps=1, num_clients=2, sums=sums.within("sync"),
                        global_params={"w": x}, mean_delta={"w": torch.zeros_like(x)})
    return sync.server_update({}, ctx)


@pytest.mark.parametrize("optimizer, kwargs", [
    ("adamw", {"weight_decay": 0.1}),  # DiLoCo's inner optimizer (torch's AdamW)
    ("muon", {"routing": "ndim>=2", "weight_decay": 0.01}),  # MuLoCo's (Muon on the matrix)
])
def test_kept_state_steps_as_one_optimizer_never_rebuilt(optimizer, kwargs):
    """One client, three rounds of two steps, the model carried over (as with one client and an outer step of 1):
    with its whole state kept the client's steps are those of one optimizer over six steps, bit for bit; with the
    state reset they are not."""
    local = LocalOptimizer(optimizer, dict(kwargs))
    targets = _grads(0, 6)
    x0 = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    reference = {"w": torch.nn.Parameter(x0.clone())}
    continuous = local.build(reference, 0.01)
    for target in targets:
        reference["w"].grad = reference["w"].detach() - target
        continuous.step()
    results = {}
    for label, sync in (("kept", PersistLocal(keep="state")), ("reset", Reset())):
        x, store = x0.clone(), ClientStateStore()
        for r in range(3):
            x, _ = _client_round(sync, local, 0, r, x, targets[2 * r:2 * r + 2], store, {})
        results[label] = x
    assert torch.equal(results["kept"], reference["w"].detach())
    assert not torch.allclose(results["reset"], reference["w"].detach())


def test_presets_keep_the_inner_state_and_the_reset_variant_remains_a_setting():
    from fedhf.algorithms import compose
    for name in ("diloco", "muloco"):
        sync = get_algorithm(name).state_sync
        assert isinstance(sync, PersistLocal) and sync.keep == "state" and sync.carries_state
        assert isinstance(compose(name, state_sync="reset").state_sync, Reset)


def _local_adam_reference(x0, targets, rounds, steps, lr):
    """Local Adam written out: two clients, each a torch AdamW; after every round the parameters and both moments
    are replaced by their mean over the clients (summed in float64 as fedhf sums, then cast back), the step
    counters stay each client's own."""
    params = [{"w": torch.nn.Parameter(x0.clone())} for _ in range(2)]
    optimizers = [torch.optim.AdamW(list(p.values()), lr=lr, weight_decay=0.01) for p in params]
    for r in range(rounds):
        for c in range(2):
            for target in targets[c][r * steps:(r + 1) * steps]:
                params[c]["w"].grad = params[c]["w"].detach() - target
                optimizers[c].step()
        with torch.no_grad():
            mean_w = sum(p["w"].detach().double() for p in params) / 2
            for p in params:
                p["w"].copy_(mean_w.to(p["w"].dtype))
            for key in ("exp_avg", "exp_avg_sq"):
                states = [o.state[p["w"]] for o, p in zip(optimizers, params)]
                mean = sum(s[key].double() for s in states) / 2
                for s in states:
                    s[key] = mean.to(s[key].dtype).clone()  # each its own (AdamW updates in place)
    return params[0]["w"].detach()


def test_desloc_with_every_period_one_is_local_adam():
    lr, rounds, steps = 0.01, 3, 2
    local = LocalOptimizer("adamw", {"weight_decay": 0.01})
    targets = [_grads(10 + c, rounds * steps) for c in range(2)]
    x0 = torch.randn(SHAPE, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    sync, store, x, broadcast = DesLoc(1, 1), ClientStateStore(), x0.clone(), {}
    for r in range(rounds):
        results = [_client_round(sync, local, c, r, x, targets[c][r * steps:(r + 1) * steps], store, broadcast)
                   for c in range(2)]
        x = (sum(w.double() for w, _ in results) / 2).to(x.dtype)  # FedAvg of the parameters
        broadcast = _server(sync, [m for _, m in results], x)
        assert set(broadcast) == {"exp_avg:w", "exp_avg_sq:w"}  # the step counters are never averaged
    assert torch.equal(x, _local_adam_reference(x0, targets, rounds, steps, lr))


def test_desloc_uploads_each_moment_at_its_own_period():
    local = LocalOptimizer("adamw", {})
    sync, store = DesLoc(first_moment_period=2, second_moment_period=3), ClientStateStore()
    x = torch.zeros(SHAPE, dtype=torch.float64)
    sent = []
    for r in range(6):
        _, message = _client_round(sync, local, 0, r, x, _grads(r, 1), store, {})
        sent.append(sorted(k[len("theta."):].split(":")[0] for k in message.tensors if k.startswith("theta.")))
    assert sent == [[], ["exp_avg"], ["exp_avg_sq"], ["exp_avg"], [], ["exp_avg", "exp_avg_sq"]]
    with pytest.raises(ValueError, match="first_moment_period"):
        DesLoc(first_moment_period=0)
