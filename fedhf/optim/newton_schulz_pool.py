"""Newton-Schulz iterations of several optimizer steps run together: one batched call per matrix shape.

Muon orthogonalises every matrix's momentum with five Newton-Schulz steps, three small matmuls each. The clients of
a batched chunk (``batched_clients``) each hold their own copy of every LoRA factor, so a Muon step of C clients
orthogonalises C copies of each matrix: run one client after the other, that is C x (factors) tiny iterations;
stacked, it is one batched iteration per shape, as :class:`fedhf.optim.muon_batched.BatchedMuon` batches the
matrices of one optimizer.

How: a step that orthogonalises is written as a generator (its *parts*): it does everything up to its
Newton-Schulz iterations (momentum, the update to orthogonalise), yields an :class:`Orthogonalise` request, is
sent the orthogonalised matrices back and finishes (weight decay, the update). :class:`StepsTogether` starts the
clients' steps one by one (each under its own fp16 loss-scaling check), then answers all their requests with one
:func:`batched_newton_schulz` per oriented shape and lets them finish. Each matrix is iterated by itself inside
the batch (its own norm, its own products), so a client's result is what its own optimizer computes alone, up to
the blocking of the batched kernel (tests/trainer/runners/test_batched_round.py compares with sequential clients).

Which steps: :class:`BatchedMuon`'s (MuonAdamW with ``newton_schulz="batched"`` or ``"gram"``), whose client alone
runs the same batched kernel. The kernel is batch-invariant with float32-accumulated products (``default_matmul`` on
CPUs without bfloat16 matmul units), so there a chunk's clients equal sequential ones bit for bit; with bfloat16
matmuls (GPUs, AVX512-BF16 / AMX CPUs) a matrix's result can move by a bfloat16 step with the batch it is in, and a
chunk is within 1e-3 of sequential clients (2.8e-4 on a tiny Llama after 2 steps; docs/scaling.md). torch.optim.Muon (the
default ``newton_schulz="torch"``) iterates each matrix with 2-D bfloat16 matmuls; a batched bfloat16 kernel sums
in another order, and on LoRA factors of a trained model the results differ by a bfloat16 ulp in places, which
Muon's steps amplify (9e-3 on the adapter after 6 steps of a tiny Llama, against 0 otherwise): so each client
of the default form keeps torch's own step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, Generator, List, Optional, Tuple

import torch

from .muon_batched import BatchedMuon, batched_newton_schulz, default_matmul, oriented_shape
from .muon_step import finish, muon_parts


@dataclass(frozen=True)
class Orthogonalise:
    """Matrices to orthogonalise, with the iteration's settings (``batched_newton_schulz``'s arguments)."""
    matrices: List[torch.Tensor]
    ns_steps: int
    eps: float
    matmul: str
    iteration: str

    def key(self, matrix: torch.Tensor) -> Tuple:
        """Matrices of one key are iterated in one batched call."""
        return (*oriented_shape(matrix.shape), matrix.dtype, matrix.device, self.ns_steps, self.eps, self.matmul,
                self.iteration)


#: A step written as parts: yields its requests, is sent each request's orthogonalised matrices back.
StepParts = Generator[Orthogonalise, List[torch.Tensor], None]


def orthogonalise_all(requests: List[Orthogonalise]) -> List[List[torch.Tensor]]:
    """Every request's matrices orthogonalised, one batched Newton-Schulz per key across all requests."""
    by_key: Dict[Tuple, List[Tuple[int, int]]] = defaultdict(list)
    for r, request in enumerate(requests):
        for m, matrix in enumerate(request.matrices):
            by_key[request.key(matrix)].append((r, m))
    answers: List[List[Optional[torch.Tensor]]] = [[None] * len(request.matrices) for request in requests]
    for places in by_key.values():
        first = requests[places[0][0]]
        orthos = batched_newton_schulz([requests[r].matrices[m] for r, m in places], first.ns_steps, first.eps,
                                       first.matmul, first.iteration)
        for (r, m), ortho in zip(places, orthos):
            answers[r][m] = ortho
    return answers  # type: ignore[return-value]


class StepsTogether:
    """Steps started one by one (:meth:`start`), their Newton-Schulz requests answered together (:meth:`finish`)."""

    def __init__(self) -> None:
        self.pending: List[Tuple[StepParts, Orthogonalise]] = []

    def start(self, parts: StepParts) -> None:
        """Run a step up to its first request (a step without one just runs)."""
        self._advance(parts, None)

    def finish(self) -> None:
        """Answer the pending requests together until every step has run to its end."""
        while self.pending:
            pending, self.pending = self.pending, []
            for (parts, _), answer in zip(pending, orthogonalise_all([request for _, request in pending])):
                self._advance(parts, answer)

    def _advance(self, parts: StepParts, answer: Optional[List[torch.Tensor]]) -> None:
        try:
            self.pending.append((parts, parts.send(answer)))  # send(None) starts a fresh generator
        except StopIteration:
            pass


def run_alone(parts: StepParts) -> None:
    """A step on its own: its requests answered as they come."""
    steps = StepsTogether()
    steps.start(parts)
    steps.finish()


def muon_step_parts(optimizer: BatchedMuon) -> StepParts:
    """One step of :class:`BatchedMuon`: fedhf's one Muon step (fedhf/optim/muon_step.py) per group, its updates
    requested with the group's ``matmul`` and ``iteration``. No context manager spans a ``yield`` (another
    client's step runs in between): each half runs under its own no_grad."""
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            continue
        parts = muon_parts(optimizer.state, params, group)
        with torch.no_grad():
            updates = next(parts)
        matmul = group["matmul"] or default_matmul(updates[0].device)
        orthos = yield Orthogonalise(updates, group["ns_steps"], group["eps"], matmul, group["iteration"])
        with torch.no_grad():
            finish(parts, orthos)
