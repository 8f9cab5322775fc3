"""A user's round hooks under client-level DP: what they add to the round's log is withheld unless they declare it.

A user hook runs before the clip and the noise (fedhf/trainer/hooks/round_features.py): its ``on_client_message``
reads each client's unclipped message and its ``after_sums`` the sums before the noise. Anything it computes from
them and writes into a round's log would reach the history file, ``report_to`` and the Hub beside an epsilon that
does not cover it (REVIEW Part A, N4). So under DP each user hook runs inside :class:`ReleasedOnly`: it gets a copy
of the round's log, and only the keys its class lists in ``released_under_dp`` (values it vouches are computed
from public data or from the released model alone) come back into it; every other key it adds or changes is
withheld, with one warning per key. A hook that overrides ``select_clients`` is warned once: the accountant's
amplification assumes the cohort is sampled independently of any client's data (S3). A hook's ``sample_size`` is
not forwarded (the accountant counts the config's cohort, fedhf/trainer/config/clock_policy.py); a hook that
overrides it is warned once, so it is not ignored silently.
"""

from __future__ import annotations

import logging
from typing import List, Sequence

from .base import ClientMessages, RoundHook, overrides

logger = logging.getLogger(__name__)


class ReleasedOnly(RoundHook):
    """One user hook under DP: every event but ``sample_size`` forwarded; its additions to a round's log kept only
    where declared."""

    def __init__(self, hook: RoundHook) -> None:
        self.hook = hook
        self.withheld: set = set()

    @property
    def sample_within_policy(self) -> bool:
        # its sample_size answers the default (the accountant's cohort); its select_clients is the user's, which may
        # add clients unless the user's hook declares it does not
        return not overrides(self.hook, "select_clients") or self.hook.sample_within_policy

    @property
    def state_name(self) -> str:  # the user's hook, not this wrapper, in checkpoints and errors
        return self.hook.state_name

    def _filtered(self, entry: dict, scratch: dict) -> None:
        for key, value in scratch.items():
            if key in entry and entry[key] is value:
                continue
            if key in self.hook.released_under_dp:
                entry[key] = value
            elif key not in self.withheld:
                self.withheld.add(key)
                logger.warning("dp_mode=%r: %s's %r is not written to the round's log (history, report_to, Hub): a "
                               "user hook sees unclipped messages and un-noised sums, which the privacy guarantee "
                               "does not cover; list it in %s.released_under_dp only if it is computed from public "
                               "data or the released model alone", type(self.hook).__name__, type(self.hook).__name__,
                               key, type(self.hook).__name__)

    def on_train_begin(self, trainer, run) -> None:
        if type(self.hook).select_clients is not RoundHook.select_clients:
            logger.warning("dp_mode is on and %s overrides select_clients: the accountant's amplification by "
                           "sampling assumes each round's clients are drawn independently of any client's data; a "
                           "choice that reads client data (their updates, losses or rows) voids the epsilon "
                           "reported", type(self.hook).__name__)
        if type(self.hook).sample_size is not RoundHook.sample_size:
            logger.warning("dp_mode is on: %s.sample_size is not asked; every round samples the config's cohort "
                           "(clients_per_round, over-selected by a deadline round), the one the privacy accountant "
                           "counts", type(self.hook).__name__)
        self.hook.on_train_begin(trainer, run)

    def sample_size(self, trainer, run, default: int) -> int:
        return default  # not the user's: the loop must sample the cohort the privacy accountant counts

    def select_clients(self, trainer, run, clients: Sequence[int]) -> List[int]:
        return self.hook.select_clients(trainer, run, clients)

    def before_round(self, trainer, run) -> None:
        self.hook.before_round(trainer, run)

    def broadcast_bytes(self, trainer, run, dense: int) -> int:
        return self.hook.broadcast_bytes(trainer, run, dense)

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        return self.hook.on_client_message(trainer, ctx, sent)

    def after_sums(self, trainer, run, sums) -> None:
        self.hook.after_sums(trainer, run, sums)

    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        scratch = dict(entry)
        self.hook.after_aggregate(trainer, run, sums, scratch)
        self._filtered(entry, scratch)

    def after_evaluate(self, trainer, run, entry: dict) -> None:
        scratch = dict(entry)
        self.hook.after_evaluate(trainer, run, scratch)
        self._filtered(entry, scratch)

    def after_round(self, trainer, run, entry: dict) -> bool:
        scratch = dict(entry)
        stop = self.hook.after_round(trainer, run, scratch)
        self._filtered(entry, scratch)
        return stop

    def on_checkpoint(self, trainer, run, directory: str) -> None:
        self.hook.on_checkpoint(trainer, run, directory)

    def on_train_end(self, trainer, run) -> None:
        self.hook.on_train_end(trainer, run)

    def checkpoint_state(self, trainer, run):
        return self.hook.checkpoint_state(trainer, run)

    def restore_state(self, trainer, run, meta: dict, groups) -> None:
        self.hook.restore_state(trainer, run, meta, groups)


def user_hooks(hooks: Sequence[RoundHook], dp: bool) -> List[RoundHook]:
    """The user's hooks as the loop calls them: as they are, or under DP each in :class:`ReleasedOnly`."""
    return [ReleasedOnly(h) for h in hooks] if dp else list(hooks)
