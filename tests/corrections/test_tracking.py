"""Parameter tracking (FAdamET / FAdamGT) against hand computations on a two-step toy."""

from __future__ import annotations

import pytest
import torch

from fedhf.core.sums import RoundSums
from fedhf.core.context import ClientContext, ServerContext
from fedhf.corrections.tracking import ParameterTracking, tracked_clients
from fedhf.optim.amsgrad import AMSGradNoBias
from fedhf.core.client_store import ClientStateStore

X0 = [1.0, -1.0]
Y = [0.2, -0.1]
Y_I = [0.05, 0.3]
GRADS = [[0.5, 0.4], [-0.2, 0.1]]  # the raw (clipped) minibatch gradients of the two local steps
LR, K = 0.1, 2


def T(values):
    return torch.tensor(values, dtype=torch.float64)  # float64, so the hand computations can be tight
PARTICIPANTS = [7, 3, 5, 1]  # sampling order; with fraction 0.5, Y_r = {7, 3}


def _ctx(client_id=3, y=Y, y_i=Y_I, participants=PARTICIPANTS):
    store = ClientStateStore()
    if y_i is not None:
        store.put(client_id, "tracking_y", {"w": T(y_i)})
    p = torch.nn.Parameter(T(X0))
    return ClientContext(client_id=client_id, round=0, round_lr=1.0, local_lr=LR, local_steps=K, weight=1.0,
                         params={"w": p}, global_params={"w": T(X0)}, correction_state={"y.w": T(y)},
                         store=store, participants=participants, num_clients=10)


def _round(tracking, ctx, optimizer=None):
    """The trainer's local loop (docs/algorithms.md 2.13): hooks around an optimizer step, SGD at local_lr unless given.
    Returns the gradients the optimizer saw, the optimizer's own directions (before the ET shift) and the client's
    message."""
    p = ctx.params["w"]
    optimizer = optimizer or torch.optim.SGD([p], lr=ctx.local_lr)
    seen, directions = [], []
    mine = tracking.client_begin(ctx)
    for g in GRADS:
        p.grad = T(g)
        tracking.before_step(ctx, mine)
        seen.append(p.grad.tolist())
        before = p.detach().clone()
        optimizer.step()
        directions.append((before - p.detach()) / ctx.local_lr)
        tracking.after_step(ctx, mine)
        optimizer.zero_grad(set_to_none=True)
    sent = tracking.client_end(ctx, mine)  # the client's message (a value)
    return seen, directions, sent


def _sent(ctx, sent):
    sums = RoundSums()
    sums.add_message(sent)
    return sums.tensors("dy", ctx.global_params)["w"].tolist(), sums.scalar("n_track")


def test_tracked_clients_are_a_prefix_of_the_sampling_order():
    assert tracked_clients(PARTICIPANTS, 0.5) == [7, 3]
    assert tracked_clients(PARTICIPANTS, 0.6) == [7, 3, 5]  # ceil(2.4)
    assert tracked_clients(PARTICIPANTS, 1.0) == PARTICIPANTS
    assert tracked_clients([4], 0.1) == [4]


def test_estimate_tracking_shifts_the_update_and_refreshes_from_the_model_change():
    ctx = _ctx()
    seen, _, sent = _round(ParameterTracking("after"), ctx)
    assert seen == T(GRADS).tolist()  # the gradient is untouched
    x_k = [X0[j] - LR * sum(g[j] for g in GRADS) - K * LR * (Y[j] - Y_I[j]) for j in range(2)]
    assert ctx.params["w"].tolist() == pytest.approx(x_k, rel=1e-12, abs=1e-12)
    new_y_i = [Y_I[j] - Y[j] + (X0[j] - x_k[j]) / (LR * K) for j in range(2)]  # y_i - y + (x^r - x_K)/(eta K)
    mean_gradient = [(GRADS[0][j] + GRADS[1][j]) / K for j in range(2)]
    assert new_y_i == pytest.approx(mean_gradient, rel=1e-12, abs=1e-12)  # with SGD, A_k = g_k
    assert ctx.store.get(3, "tracking_y")["w"].tolist() == pytest.approx(new_y_i, rel=1e-12, abs=1e-12)
    dy, n_track = _sent(ctx, sent)
    assert dy == pytest.approx([new_y_i[j] - Y_I[j] for j in range(2)], rel=1e-12, abs=1e-12) and n_track == 1.0
    assert sent.nbytes == 2 * 8  # two float64 values


def test_estimate_tracking_refresh_is_the_mean_adam_direction():
    """Known identity: with FAdamET, y_i+ = (1/K) sum_k A_k, the optimizer's own directions."""
    ctx = _ctx()
    optimizer = AMSGradNoBias([("w", ctx.params["w"])], lr=LR)
    _, directions, _ = _round(ParameterTracking("after"), ctx, optimizer)
    mean_direction = (directions[0] + directions[1]) / 2
    assert torch.allclose(ctx.store.get(3, "tracking_y")["w"], mean_direction, rtol=1e-12, atol=1e-12)


def test_gradient_tracking_corrects_the_gradient_and_refreshes_from_raw_gradients():
    ctx = _ctx()
    seen, _, sent = _round(ParameterTracking("before"), ctx)
    corrected = [[g[j] + Y[j] - Y_I[j] for j in range(2)] for g in GRADS]
    assert seen == [pytest.approx(c, rel=1e-12, abs=1e-12) for c in corrected]
    x_k = [X0[j] - LR * sum(g[j] + Y[j] - Y_I[j] for g in GRADS) for j in range(2)]
    assert ctx.params["w"].tolist() == pytest.approx(x_k, rel=1e-12, abs=1e-12)
    new_y_i = [(GRADS[0][j] + GRADS[1][j]) / K for j in range(2)]  # raw, uncorrected gradients
    assert ctx.store.get(3, "tracking_y")["w"].tolist() == pytest.approx(new_y_i, rel=1e-12, abs=1e-12)
    dy, n_track = _sent(ctx, sent)
    assert dy == pytest.approx([new_y_i[j] - Y_I[j] for j in range(2)], rel=1e-12, abs=1e-12) and n_track == 1.0


@pytest.mark.parametrize("position", ["after", "before"])
def test_clients_outside_the_tracked_subset_send_nothing_and_keep_y_i(position):
    ctx = _ctx(client_id=5)  # in S_r but not among the first half
    _, _, sent = _round(ParameterTracking(position), ctx)
    assert sent.tensors == {}  # no dy, no n_track
    assert sent.nbytes == 0
    assert ctx.store.get(5, "tracking_y")["w"].tolist() == Y_I
    # ... but it still trains with the correction
    shifted = [X0[j] - LR * sum(g[j] for g in GRADS) - K * LR * (Y[j] - Y_I[j]) for j in range(2)]
    assert ctx.params["w"].tolist() == pytest.approx(shifted, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("position", ["after", "before"])
def test_with_y_equal_to_y_i_the_correction_is_a_no_op(position):
    ctx = _ctx(y=Y, y_i=Y)
    seen, _, _ = _round(ParameterTracking(position), ctx)
    assert seen == T(GRADS).tolist()
    plain = torch.nn.Parameter(T(X0))
    sgd = torch.optim.SGD([plain], lr=LR)
    for g in GRADS:
        plain.grad = T(g)
        sgd.step()
    assert torch.equal(ctx.params["w"].detach(), plain.detach())  # SGD alone, bit for bit


def test_first_round_starts_from_zero_tracking_terms():
    ctx = _ctx(y=[0.0, 0.0], y_i=None)  # nothing stored yet: y_i = 0
    _, _, sent = _round(ParameterTracking("before"), ctx)
    dy, _ = _sent(ctx, sent)
    assert dy == pytest.approx([(GRADS[0][j] + GRADS[1][j]) / K for j in range(2)], rel=1e-12, abs=1e-12)


def test_server_keeps_y_the_average_over_all_clients():
    sums = RoundSums()
    sums.add_tensors("dy", {"w": T([1.0, 2.0])})
    sums.add_tensors("dy", {"w": T([3.0, 0.0])})
    x = {"w": T([0.0, 0.0])}
    ctx = ServerContext(round=0, round_lr=0.1, local_steps=K, num_clients=10, sums=sums, global_params=x,
                        mean_delta=x)
    tracking = ParameterTracking("before")
    state = tracking.server_init(x)
    assert state["y.w"].tolist() == [0.0, 0.0]
    new = tracking.server_update({"y.w": T([0.5, 0.5])}, ctx)
    assert new["y.w"].tolist() == pytest.approx([0.5 + 4.0 / 10, 0.5 + 2.0 / 10], rel=1e-12)  # 1/N, not 1/|Y_r|


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="position"):
        ParameterTracking("sideways")
    with pytest.raises(ValueError, match="tracked_fraction"):
        ParameterTracking(tracked_fraction=0.0)
    with pytest.raises(ValueError, match="participants"):
        ParameterTracking().client_begin(_ctx(participants=()))
