"""Which algorithms survive secure aggregation, found by running their server halves rather than by a list.

Under secure aggregation the server learns the round's sums and nothing about any one client. So an algorithm is
compatible exactly when its server halves (the correction's and the state sync's ``server_update``, the server
rule's ``apply`` and ``base_residual``) run on sums alone. :func:`secagg_compatibility` runs them once on a tiny
LoRA-shaped model whose every sum reads as ones and whose individual updates (``ServerContext.gathered``) are
sealed: a read of them raises, and the algorithm is labelled incompatible with the reason.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Tuple

import torch

from ..core.context import ServerContext
from ..core.sums import RoundSums

# a LoRA pair and a head, named as peft names them, so that LoRA-product rules find their pairs
_PROBE_PARAMS = {
    "layer.lora_A.default.weight": (2, 4),
    "layer.lora_B.default.weight": (3, 2),
    "classifier.weight": (3, 4),
}


class IndividualMessagesRead(RuntimeError):
    """A server half read one client's message: impossible under secure aggregation."""


class _Sealed(list):
    """The gathered updates as secure aggregation leaves them: any read raises."""

    def _refuse(self, *args, **kwargs):
        raise IndividualMessagesRead("reads each client's update (ServerContext.gathered), not only the sums")

    __iter__ = __len__ = __getitem__ = __contains__ = _refuse


class _OnesSums(RoundSums):
    """Every sum a server half asks for exists: ones shaped like the parameter its key ends with (a scalar for a
    count), so the halves run to the end and only their reads of individual messages can stop them."""

    def __init__(self, params) -> None:
        super().__init__()
        self.params = params
        self.gathered = _Sealed()

    def _like(self, key: str) -> torch.Tensor:
        if key.startswith("BA."):  # a LoRA product B A, keyed by A's name (fedhf/server/lora.py)
            a, b = self.params[key[len("BA."):]], self.params["layer.lora_B.default.weight"]
            return torch.ones(b.shape[0], a.shape[1], dtype=torch.float64)
        for name, tensor in self.params.items():
            if key.endswith(name):
                return torch.ones_like(tensor, dtype=torch.float64)
        return torch.ones((), dtype=torch.float64)

    def get(self, key: str) -> torch.Tensor:
        return self._like(key)

    def scalar(self, key: str, default: float = 0.0) -> float:
        return 1.0

    def has(self, prefix: str) -> bool:
        return True

    def within(self, namespace: str) -> "RoundSums":
        return self

    def gathered_in_client_order(self):
        return self.gathered


def secagg_compatibility(algorithm) -> Tuple[bool, str]:
    """(compatible, reason): the algorithm's server halves run once on sums only."""
    params = {n: torch.full(s, 0.5) for n, s in _PROBE_PARAMS.items()}
    sums = _OnesSums(params)
    ctx = ServerContext(round=0, round_lr=0.1, local_steps=1, num_clients=4, sums=sums, global_params=params,
                        mean_delta={n: torch.zeros_like(t) for n, t in params.items()}, gathered=sums.gathered)
    try:
        algorithm.correction.server_update(algorithm.correction.server_init(dict(params)), ctx)
        algorithm.state_sync.server_update({}, ctx)
        rule = algorithm.server_rule
        new, _ = rule.apply(dict(params), rule.init(dict(params)), replace(ctx))
        rule.base_residual(new, ctx)
    except IndividualMessagesRead as err:
        return False, f"its server rule {algorithm.server_rule.name!r} {err}"
    except Exception as err:  # noqa: BLE001 -- a half that cannot run on sums alone is not known to be compatible
        return False, f"its server halves could not run on sums alone ({type(err).__name__}: {err})"
    return True, "its server halves read only sums"
