"""ShardedMuon (fedhf.optim.sharded_muon) on one process -- every matrix whole, its own shard -- is torch.optim.Muon
bit for bit: the shared Muon step (fedhf/optim/muon_step.py) with torch's Newton-Schulz, for each lr adjustment.
(Two processes: tests/runtime/test_sharded.py.)"""

from __future__ import annotations

import pytest
import torch

from fedhf.optim.sharded_muon import ShardedMuon
from tests.helpers import step_alike


class _OneShard:
    """The gather and split of a one-process model: the shard is the whole matrix."""

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        return local

    def local_part(self, full: torch.Tensor) -> torch.Tensor:
        return full


@pytest.mark.parametrize("adjust_lr_fn", [None, "match_rms_adamw"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_one_process_is_torch_muon_bit_for_bit(adjust_lr_fn, nesterov):
    torch.manual_seed(0)
    shapes = [(4, 24), (24, 4), (24, 24), (48, 24)]  # wide, tall, square: each lr adjustment's cases
    ref = [torch.nn.Parameter(torch.randn(*s) * 0.1) for s in shapes]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    reference = torch.optim.Muon(ref, lr=0.02, weight_decay=0.01, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    optimizer = ShardedMuon(torch.optim.Muon(ours, lr=0.02, weight_decay=0.01, nesterov=nesterov,
                                             adjust_lr_fn=adjust_lr_fn).param_groups, _OneShard())
    step_alike(optimizer, reference, ours, ref, steps=3)
    for p, q in zip(ours, ref):
        assert torch.equal(p, q)
        assert torch.equal(optimizer.state[p]["momentum_buffer"], reference.state[q]["momentum_buffer"])
