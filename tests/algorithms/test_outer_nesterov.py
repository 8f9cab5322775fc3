"""DiLoCo and MuLoCo: their outer step by hand, and with outer lr 1 and no momentum, FedAvg of the inner optimizer
(a real run on pretrained MiniLM + LoRA)."""

from __future__ import annotations

import pytest
import torch

from fedhf.algorithms import get_algorithm
from fedhf.core.context import ServerContext
from fedhf.core.sums import RoundSums
from fedhf.sync import PersistLocal

from tests.helpers import config, lora_minilm, trainable_state, tweet_trainer


@pytest.mark.parametrize("name, lr, beta", [("diloco", 0.7, 0.9), ("muloco", 0.9, 0.8)])
def test_outer_step_is_nesterov_by_hand_over_three_rounds(name, lr, beta):
    algorithm = get_algorithm(name)
    assert isinstance(algorithm.state_sync, PersistLocal) and not algorithm.correction.carries_state
    rule, x0 = algorithm.server_rule, [0.5, -1.0]
    rounds = [[[0.2, -0.1], [0.0, 0.3]], [[-0.4, 0.1], [0.2, 0.2]], [[0.1, 0.5], [-0.3, 0.0]]]  # two clients each
    x = {"w": torch.tensor(x0, dtype=torch.float64)}
    state = rule.init(x)
    for deltas in rounds:
        mean = {"w": torch.tensor(deltas, dtype=torch.float64).mean(0)}
        ctx = ServerContext(round=0, round_lr=1.0, local_steps=1, num_clients=2, sums=RoundSums(), global_params=x,
                            mean_delta=mean)
        x, state = rule.apply(x, state, ctx)
    expected = []
    for j, value in enumerate(x0):  # DiLoCo's outer SGD: g = x^r - mean_i x_i; u = b u + g; x -= lr (g + b u)
        u = 0.0
        for deltas in rounds:
            g = -(deltas[0][j] + deltas[1][j]) / 2
            u = beta * u + g
            value -= lr * (g + beta * u)
        expected.append(value)
    assert x["w"].tolist() == pytest.approx(expected, rel=1e-12)


def test_outer_lr_one_without_momentum_is_fedavg(minilm, tweets, tokenizer, tmp_path):
    """Averaging the clients' models: DiLoCo with server_lr 1 and momentum 0 is Local AdamW at DiLoCo's inner
    settings with each client's inner state kept (MuLoCo's outer rule is the same class, checked by hand above), and
    it moves the model; with the state reset (Local AdamW as preset) it lands elsewhere."""
    inner = get_algorithm("diloco").local_optimizer.kwargs
    common = dict(num_clients=3, clients_per_round=2, num_rounds=2, local_steps=2, dirichlet_alpha=0.3,
                  per_device_train_batch_size=8)
    states = {}
    keep = {"state_sync": "persist_local", "state_sync_kwargs": {"keep": "state"}}
    for label, algorithm, kwargs, sync in (("diloco", "diloco", {"server_lr": 1.0, "server_momentum": 0.0}, {}),
                                           ("fedavg", "local_adamw", dict(inner), keep),
                                           ("reset", "local_adamw", dict(inner), {})):
        model = lora_minilm(minilm, dropout=False)
        before = trainable_state(model)
        args = config(tmp_path / label, algorithm=algorithm, algorithm_kwargs=kwargs, **sync, **common)
        tweet_trainer(model, tweets, tokenizer, args, evaluate=False).train()
        states[label] = trainable_state(model)
        assert any(not torch.equal(before[n], states[label][n]) for n in before)
    for n in states["fedavg"]:
        torch.testing.assert_close(states["diloco"][n], states["fedavg"][n], rtol=1e-5, atol=1e-7, msg=n)
    assert any(not torch.allclose(states["diloco"][n], states["reset"][n], rtol=1e-5, atol=1e-7) for n in states["reset"])
