"""Client and server halves of each correction against hand computations on small tensors."""

from __future__ import annotations

import pytest
import torch

from fedhf.core.sums import RoundSums
from fedhf.core.context import ClientContext, ServerContext
from fedhf.corrections import ControlVariate, GlobalMix, Proximal
from fedhf.core.client_store import ClientStateStore


def _ctx(param, grad, global_value, correction_state, store=None, lr=0.1, steps=2, client_id=3):
    p = torch.nn.Parameter(torch.tensor(param))
    p.grad = torch.tensor(grad)
    return ClientContext(client_id=client_id, round=0, round_lr=lr, local_lr=lr, local_steps=steps, weight=1.0,
                         params={"w": p}, global_params={"w": torch.tensor(global_value)}, correction_state=correction_state,
                         store=store or ClientStateStore())


def test_proximal_adds_mu_times_distance_to_the_global_model():
    ctx = _ctx([1.0, 2.0], [0.5, -0.5], [0.0, 3.0], {})
    Proximal(mu=0.1).before_step(ctx, None)
    assert ctx.params["w"].grad.tolist() == pytest.approx([0.5 + 0.1 * 1.0, -0.5 + 0.1 * -1.0])


def test_control_variate_client_half():
    store = ClientStateStore()
    store.put(3, "scaffold_c", {"w": torch.tensor([0.2, 0.0])})
    ctx = _ctx([1.0, 1.0], [1.0, 1.0], [1.5, 0.5], {"c.w": torch.tensor([0.1, 0.3])}, store=store, lr=0.1, steps=2)
    cv = ControlVariate()
    mine = cv.client_begin(ctx)
    cv.before_step(ctx, mine)  # g - c_i + c
    assert ctx.params["w"].grad.tolist() == pytest.approx([1.0 - 0.2 + 0.1, 1.0 - 0.0 + 0.3])
    sent = cv.client_end(ctx, mine)  # c_i+ = c_i - c + (x^r - x_K) / (K lr)
    new_c_i = [0.2 - 0.1 + (1.5 - 1.0) / 0.2, 0.0 - 0.3 + (0.5 - 1.0) / 0.2]
    assert store.get(3, "scaffold_c")["w"].tolist() == pytest.approx(new_c_i)
    sums = RoundSums()
    sums.add_message(sent)
    assert sums.tensors("dc", ctx.global_params)["w"].tolist() == pytest.approx([new_c_i[0] - 0.2, new_c_i[1]])
    assert sent.nbytes == 2 * 4


def test_control_variate_server_half_divides_by_the_population():
    sums = RoundSums()
    sums.add_tensors("dc", {"w": torch.tensor([1.0, 2.0])})
    sums.add_tensors("dc", {"w": torch.tensor([3.0, 0.0])})
    x = {"w": torch.zeros(2)}
    ctx = ServerContext(round=0, round_lr=0.1, local_steps=2, num_clients=10, sums=sums, global_params=x,
                        mean_delta=x)
    new = ControlVariate().server_update({"c.w": torch.tensor([0.5, 0.5])}, ctx)
    assert new["c.w"].tolist() == pytest.approx([0.5 + 4.0 / 10, 0.5 + 2.0 / 10])


@pytest.mark.parametrize("position", ["before", "after"])
def test_global_mix_with_beta_zero_is_the_plain_step(position):
    ctx = _ctx([1.0, -1.0], [0.3, 0.4], [1.0, -1.0], {"g.w": torch.tensor([5.0, 5.0])})
    mix = GlobalMix(beta=0.0, position=position)
    assert mix.lr_scale == 1.0
    mix.before_step(ctx, None)
    mix.after_step(ctx, None)
    assert ctx.params["w"].grad.tolist() == pytest.approx([0.3, 0.4])
    assert ctx.params["w"].tolist() == pytest.approx([1.0, -1.0])


def test_global_mix_before_mixes_gradients_and_after_mixes_updates():
    ctx = _ctx([1.0, -1.0], [0.3, 0.4], [1.0, -1.0], {"g.w": torch.tensor([2.0, -2.0])}, lr=0.1)
    GlobalMix(beta=0.9, position="before").before_step(ctx, None)
    assert ctx.params["w"].grad.tolist() == pytest.approx([0.1 * 0.3 + 0.9 * 2.0, 0.1 * 0.4 - 0.9 * 2.0])
    after = GlobalMix(beta=0.5, position="after")
    assert after.lr_scale == 0.5  # the optimizer runs at (1 - beta) eta
    after.after_step(ctx, None)  # x <- x - beta eta g_G
    assert ctx.params["w"].tolist() == pytest.approx([1.0 - 0.5 * 0.1 * 2.0, -1.0 + 0.5 * 0.1 * 2.0])


def test_global_mix_server_half_is_minus_mean_delta_over_k_eta():
    x = {"w": torch.zeros(2)}
    ctx = ServerContext(round=0, round_lr=0.2, local_steps=5, num_clients=4, sums=RoundSums(), global_params=x,
                        mean_delta={"w": torch.tensor([1.0, -0.5])})
    new = GlobalMix(beta=0.5).server_update({}, ctx)
    assert new["g.w"].tolist() == pytest.approx([-1.0 / (5 * 0.2), 0.5 / (5 * 0.2)])
