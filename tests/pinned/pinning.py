"""The harness of the pinned-math tests (tests/pinned/test_*.py): a 2 x 2 affine model with a quadratic loss whose
gradients are written by hand, fixed tiny client data, and a float64 driver for hand-written reference rounds.

The model is trained by the real :class:`fedhf.FederatedTrainer`; each client's batch is all of its rows, so
every local gradient is deterministic:

    loss(W, b) = 1/2 mean_n ||W x_n + b - y_n||^2 ;  G_W = mean_n r_n x_n^T ,  G_b = mean_n r_n ,  r_n = W x_n + b - y_n

The reference rounds (docs/algorithms.md sections 0 and 2) are written in the tests with plain torch ops on float64
dicts {"lin.weight": W, "lin.bias": b}; the trainer keeps the global model in float32, hence the tolerances.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List

import datasets
import torch
from torch import nn

from fedhf import FederatedTrainer
from fedhf.core.schedule import sample_clients

from tests.helpers import config

P = Dict[str, torch.Tensor]
W, B = "lin.weight", "lin.bias"
ROWS = 2  # rows per client = the local batch: the whole client
X = torch.tensor([[1.0, 0.5], [0.25, -1.0],       # client 0
                  [-0.5, 1.5], [1.25, 0.75],      # client 1
                  [2.0, -0.25], [-1.0, -0.5]],    # client 2
                 dtype=torch.float64)
Y = torch.tensor([[1.0, -1.0], [0.5, 2.0],
                  [-1.5, 0.25], [0.75, 1.0],
                  [2.5, 0.0], [-0.75, 1.25]], dtype=torch.float64)
W0 = torch.tensor([[0.5, -0.25], [0.125, 0.75]], dtype=torch.float64)
B0 = torch.tensor([0.1, -0.2], dtype=torch.float64)


class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        with torch.no_grad():
            self.lin.weight.copy_(W0)
            self.lin.bias.copy_(B0)

    def forward(self, x, labels=None):
        logits = self.lin(x)
        if labels is None:
            return {"logits": logits}
        return {"loss": 0.5 * (logits - labels).pow(2).sum(-1).mean(), "logits": logits}


def client_rows(i: int):
    return X[ROWS * i: ROWS * (i + 1)], Y[ROWS * i: ROWS * (i + 1)]


def grad(x: P, i: int) -> P:
    """The hand-derived gradient of client i's loss at x."""
    rows, targets = client_rows(i)
    r = rows @ x[W].T + x[B] - targets
    return {W: r.T @ rows / len(rows), B: r.mean(0)}


def start() -> P:
    return {W: W0.clone(), B: B0.clone()}


def cosine(peak: float, r: int, rounds: int) -> float:
    """eta_r = peak/2 (1 + cos(pi r / R)) (docs/algorithms.md 0)."""
    return 0.5 * peak * (1 + math.cos(math.pi * r / rounds))


def clip(g: P, max_norm: float) -> P:
    """Global-norm clip of the raw gradient (torch's clip_grad_norm_: scale max_norm / (norm + 1e-6) if below 1)."""
    norm = math.sqrt(sum(float(t.pow(2).sum()) for t in g.values()))
    scale = min(1.0, max_norm / (norm + 1e-6))
    return {k: t * scale for k, t in g.items()}


def mean(dicts: List[P]) -> P:
    return {k: sum(d[k] for d in dicts) / len(dicts) for k in dicts[0]}


def avg(finals: Dict[int, P], key: str) -> torch.Tensor:
    """The mean over the round's clients of one tensor of their final models."""
    return sum(f[key] for f in finals.values()) / len(finals)


def participants(r: int, num_clients: int, per_round: int) -> List[int]:
    """The round's sample in draw order (the schedule, seed 0); clients train in id order."""
    return sample_clients(0, r, num_clients, per_round)


def federate(rounds: int, peak_lr: float, client: Callable, server: Callable, num_clients: int = 2,
             per_round: int = 0) -> P:
    """Reference rounds: ``client(i, r, eta_r, x, sample) -> x_i^K``; ``server(r, eta_r, x, {i: x_i^K}, sample)
    -> x^{r+1}``. Returns the final global model."""
    x = start()
    for r in range(rounds):
        eta = cosine(peak_lr, r, rounds)
        sample = participants(r, num_clients, per_round or num_clients)
        finals = {i: client(i, r, eta, {k: t.clone() for k, t in x.items()}, sample) for i in sorted(sample)}
        x = server(r, eta, x, finals, sample)
    return x


def mean_server(r, eta, x, finals, sample) -> P:
    return mean(list(finals.values()))


def build(tmp_path, algorithm: str, rounds: int = 1, local_steps: int = 2, num_clients: int = 2, per_round: int = 0,
          max_grad_norm: float = 0.0, **overrides) -> FederatedTrainer:
    """The real trainer on the affine model, each client holding ROWS rows (its whole batch); clipping off unless
    asked (``max_grad_norm``)."""
    args = config(tmp_path, algorithm=algorithm, num_clients=num_clients, clients_per_round=per_round or num_clients,
                  num_rounds=rounds, local_steps=local_steps, per_device_train_batch_size=ROWS,
                  max_grad_norm=max_grad_norm, **overrides)
    assert ROWS * num_clients <= len(X)
    data = datasets.Dataset.from_dict({"x": X.tolist(), "labels": Y.tolist()})
    parts = [list(range(ROWS * i, ROWS * (i + 1))) for i in range(num_clients)]
    return FederatedTrainer(model=Affine(), args=args, train_dataset=data, client_partitions=parts)


def run(tmp_path, algorithm: str, **kwargs):
    """Train (see :func:`build`); returns (final global model in float64, trainer)."""
    trainer = build(tmp_path, algorithm, **kwargs)
    trainer.train()
    return {n: p.detach().double().clone() for n, p in trainer.model.named_parameters()}, trainer


def assert_matches(actual: P, expected: P, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    moved = max(float((expected[k] - start()[k]).abs().max()) for k in expected)
    assert moved > 100 * atol, "the reference barely moves: the check would not pin anything"
    for k in expected:
        torch.testing.assert_close(actual[k], expected[k], rtol=rtol, atol=atol, msg=lambda m: f"{k}: {m}")
