"""An optimizer's whole per-parameter state as named tensors, for state-sync rules that keep or average all of it
(``persist_local`` with ``keep="state"``, ``desloc``), not just Theta.

DiLoCo's and MuLoCo's workers never touch their inner optimizer between rounds: Adam's first and second moments
and its step counter (which sets the bias correction) all carry on. Theta (fedhf/optim/base.py) is only the part
that describes the local geometry, so keeping Theta is not keeping the optimizer. The whole state is keyed as Theta
is, ``"<state key>:<parameter name>"`` (``"exp_avg:model.w"``, ``"step:model.w"``), so the client store keeps it
and spills it like any other named tensors.

A state value that is a Python number (a counter some optimizers keep as an int) travels as a 0-d tensor and comes
back as one; arithmetic on it is unchanged. A 0-d tensor comes back on the CPU, where torch keeps the step counter
of a non-capturable optimizer.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Tuple

import torch

from ..core.theta import split_theta_key, theta_key

TensorDict = dict
#: (a torch optimizer, its parameter -> name), one per optimizer that holds part of a client's state.
StateOwner = Tuple[torch.optim.Optimizer, Mapping[torch.Tensor, str]]


def export_whole_state(owners: Iterable[StateOwner]) -> TensorDict:
    """Every entry of every owner's per-parameter state, as copies keyed ``"<state key>:<parameter name>"``."""
    out = {}
    for optimizer, names in owners:
        for p, state in optimizer.state.items():
            if p not in names:
                continue
            for key, value in state.items():
                tensor = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
                out[theta_key(key, names[p])] = tensor.detach().clone()
    return out


def import_whole_state(owners: Iterable[StateOwner], state: Mapping[str, torch.Tensor]) -> None:
    """Put ``state`` (as :func:`export_whole_state` made it) into the owners' state, each entry on its parameter's
    device (0-d counters on the CPU) and in its own dtype."""
    by_name = {}
    for optimizer, names in owners:
        for p, name in names.items():
            by_name[name] = (optimizer, p)
    for key, value in state.items():
        state_key, name = split_theta_key(key)
        if name not in by_name:
            raise KeyError(f"No parameter {name!r} for the optimizer state entry {key!r}")
        optimizer, p = by_name[name]
        device = torch.device("cpu") if value.ndim == 0 else p.device
        optimizer.state[p][state_key] = value.detach().to(device=device).clone()
