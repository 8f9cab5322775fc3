"""Client-level differential privacy and secure aggregation as one round hook (the math: fedhf/privacy/).

Per client (``on_client_message``, after every hook that changes messages, so the clip bounds exactly what is
summed): every tensor the client sends, the trainer's ``dx``/``buf`` and every component's (correction, state sync,
server half), is clipped jointly to L2 norm C; under distributed DP the client adds its noise share; under secure
aggregation the result is quantised and masked. The drift diagnostics are not sent under DP; the client's training
loss is not sent either (the history's ``train_loss`` is then NaN).

On the sums (``after_sums``, before any server half reads them): secure aggregation's sum is unmasked (dropped
clients' masks removed) and decoded; under central DP Gaussian noise of std z C is added to every protected sum
from the run's noise stream; the weights' sums become the fixed denominator (the expected cohort, DP-FedAvg's
data-independent W), so a server half's mean is post-processing of the noisy sum.

After the round, ``dp_epsilon`` (dp-accounting, composed over the rounds done), ``dp_noise_multiplier`` and
``dp_clip_norm`` go into the round's log (history, plots, model card); with ``dp_stop_at_budget`` the run stops
before a round would exceed ``dp_epsilon``. The accountant's round count, the adaptive C and the noise stream's
state are part of the round checkpoint, so a resumed run is bit-identical, noise included.

The noise stream is seeded from the run's seed so a simulation is reproducible; a deployment must draw the noise
from a secret source (whoever knows the seed can subtract it).
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch

from ..core.message import Message
from ..core.params import TensorDict
from ..core.schedule import stream_seed
from ..privacy import adaptive_clip_update, clip_jointly
from ..privacy.secagg import masked_bytes
from .hooks import ClientMessages, RoundHook
from .privacy_settings import accountant, count_std, dp_on, noise_multiplier, secagg_codec, sums_noise_multiplier

NOISE_STREAM = 0xD9  # the central noise's stream tag
SHARE_STREAM = 0xDA  # a client's distributed-noise share
UNSENT = ("drift", "dp", "secagg")  # diagnostics a deployment does not send, and this hook's own namespaces
CHECKPOINT_GROUP = "privacy"


def full_items(sent: ClientMessages) -> Dict[str, torch.Tensor]:
    """Every tensor of the client's messages by the key its sum has (the trainer's own keys as they are)."""
    items = dict(sent.own.tensors)
    for namespace, message in sent.components.items():
        items.update({f"{namespace}.{k}": v for k, v in message.tensors.items()})
    return items


def protected(key: str, tensor: torch.Tensor) -> bool:
    """Clipped, noised and securely summed: every tensor with at least one dimension outside the unsent
    namespaces. The 0-d entries are counts and weights (``w``, ``n``): fixed or diagnostic, never data."""
    return tensor.dim() >= 1 and key.split(".", 1)[0] not in UNSENT


def _put_back(sent: ClientMessages, values: Dict[str, torch.Tensor]) -> None:
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if head in sent.components:
            sent.components[head].tensors[rest] = value
        else:
            sent.own.tensors[key] = value


def _is_weight(key: str) -> bool:
    return key == "w" or key.endswith(".w")


class Privacy(RoundHook):
    """The round hook; does nothing when ``dp_mode='off'`` and ``secure_aggregation=False``."""

    def __init__(self, trainer) -> None:
        args = self.args = trainer.args
        self.dp, self.secure = dp_on(args), args.secure_aggregation
        self.z = noise_multiplier(args) if self.dp else 0.0  # calibrated here, before any round
        self.z_sums = sums_noise_multiplier(args, self.z) if self.dp else 0.0
        self.accountant = accountant(args, self.z) if self.dp else None
        self.clip_norm = args.dp_clip_norm
        self.round_clip = self.clip_norm  # the C this round's clients clip with
        self.codec = secagg_codec(args, self.z_sums) if self.secure else None
        self.noise = torch.Generator().manual_seed(stream_seed(args.seed, NOISE_STREAM))
        self.cohort: List[int] = []

    @property
    def active(self) -> bool:
        return self.dp or self.secure

    # ---------------------------------------------------------------- the client side
    def before_round(self, trainer, run) -> None:
        self.cohort = list(run.cohort)  # the round's clients after selection (the secure sum's partners)
        self.round_clip = self.clip_norm

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        if not self.active:
            return sent
        if self.dp:
            sent.components.pop("drift", None)  # the drift metric reads Theta_i: not released under DP
            sent.own.tensors.pop("loss", None)
        items = {k: v for k, v in full_items(sent).items() if protected(k, v)}
        if self.dp:
            items, norm = clip_jointly(items, self.round_clip)
            if self.args.dp_mode == "distributed":
                items = self._noise_share(items, ctx)
            if self.args.dp_adaptive_clip_quantile is not None:  # Andrew et al.: b_i, summed with noise
                sent.components["dp"] = Message().put_scalar("below", float(norm <= self.round_clip))
        if self.secure:
            encoded = self.codec.quantise(items, ctx.round, ctx.client_id)
            masked = self.codec.mask(encoded, ctx.round, ctx.client_id, self.cohort)
            items = {k: v.to(torch.float64).to(items[k].device) for k, v in masked.items()}
            present = torch.zeros(self.args.num_clients, dtype=torch.float64)
            present[ctx.client_id] = 1.0  # who sent: the server of a secure aggregation knows it
            sent.components["secagg"] = Message().put("present", {"clients": present}, nbytes=0)
            self._count_masked_bytes(sent, items)
        _put_back(sent, items)
        return sent

    def _noise_share(self, items: Dict[str, torch.Tensor], ctx) -> Dict[str, torch.Tensor]:
        """Distributed DP: N(0, (z C)^2 / S) per element, from the client's own stream; S shares sum to z C."""
        std = self.z_sums * self.round_clip / math.sqrt(self.args.clients_per_round)
        generator = torch.Generator().manual_seed(stream_seed(self.args.seed, SHARE_STREAM, ctx.round, ctx.client_id))
        return {k: items[k] + std * torch.randn(items[k].shape, generator=generator, dtype=torch.float64)
                .to(items[k].device) for k in sorted(items)}

    def _count_masked_bytes(self, sent: ClientMessages, items: Dict[str, torch.Tensor]) -> None:
        """Under secure aggregation every protected element travels as a 32-bit word (products a plain server
        would form from A and B must be sent too); the key agreement per partner is added to the own message."""
        def shapes(namespace: str = "") -> Dict[str, torch.Size]:
            mine = (lambda k: k.startswith(namespace + ".")) if namespace else \
                (lambda k: k.split(".", 1)[0] not in sent.components)
            return {k: v.shape for k, v in items.items() if mine(k)}

        sent.own.nbytes = masked_bytes(shapes(), partners=max(len(self.cohort) - 1, 0))
        for namespace, message in sent.components.items():
            message.nbytes = 0 if namespace in UNSENT else masked_bytes(shapes(namespace), partners=0)

    # ---------------------------------------------------------------- the server side
    def after_sums(self, trainer, run, sums) -> None:
        if not self.active:
            return
        keys = sorted(k for k, v in sums.items() if protected(k, v))
        if self.secure and sums.has("secagg.present"):
            self._unmask(sums, keys, run.rounds_done)
        if not self.dp:
            return
        if self.args.dp_mode == "central":
            std = self.z_sums * self.round_clip
            for key in keys:  # sorted: the draws do not depend on the order clients were added
                value = sums.get(key)
                noise = torch.randn(value.shape, generator=self.noise, dtype=torch.float64).to(value.device)
                sums.set(key, value + std * noise)
        if sums.scalar("n") > 0:
            for key, value in sums.items():  # the fixed denominator: w_i = 1, W = the expected cohort
                if _is_weight(key) and value.dim() == 0:
                    sums.set(key, float(self.args.clients_per_round))
        sums.set("loss", float("nan"))
        if self.args.dp_adaptive_clip_quantile is not None:
            noisy = sums.scalar("dp.below") + count_std(self.args) * float(
                torch.randn((), generator=self.noise, dtype=torch.float64))
            self.clip_norm = adaptive_clip_update(self.round_clip, noisy, self.args.clients_per_round,
                                                  self.args.dp_adaptive_clip_quantile, self.args.dp_adaptive_clip_lr)

    def _unmask(self, sums, keys: List[str], round_index: int) -> None:
        present = sums.get("secagg.present.clients")
        survivors = [int(c) for c in torch.nonzero(present > 0.5).flatten().tolist()]
        dropped = [c for c in self.cohort if c not in set(survivors)]
        total = {k: sums.get(k).to(torch.float64).cpu().round().to(torch.int64) for k in keys}
        total = self.codec.remove_dropped(total, round_index, survivors, dropped)
        for key, value in self.codec.decode(total, len(survivors)).items():
            sums.set(key, value.to(sums.get(key).device))

    # ---------------------------------------------------------------- the log, the budget, the checkpoint
    def after_aggregate(self, trainer, run, sums, entry: dict) -> None:
        if not self.dp:
            return
        entry.update({"dp_epsilon": self.accountant.step(), "dp_noise_multiplier": self.z,
                      "dp_clip_norm": self.round_clip})

    def after_round(self, trainer, run, entry: dict) -> bool:
        if not (self.dp and self.args.dp_stop_at_budget and self.args.dp_epsilon is not None):
            return False
        return self.accountant.epsilon(self.accountant.rounds + 1) > self.args.dp_epsilon

    def checkpoint_state(self, trainer, run) -> Tuple[dict, Dict[str, TensorDict]]:
        if not self.dp:
            return {}, {}
        meta = {"privacy": {"rounds": self.accountant.rounds, "clip_norm": self.clip_norm}}
        return meta, {CHECKPOINT_GROUP: {"noise_rng": self.noise.get_state()}}

    def restore_state(self, trainer, run, meta: dict, groups: Dict[str, TensorDict]) -> None:
        if not self.dp:
            return
        if "privacy" not in meta or CHECKPOINT_GROUP not in groups:
            raise ValueError("The checkpoint holds no privacy accountant state (it was written without DP): resume "
                             "it with dp_mode='off', or start a new run.")
        self.accountant.rounds = int(meta["privacy"]["rounds"])
        self.clip_norm = float(meta["privacy"]["clip_norm"])
        self.noise.set_state(groups[CHECKPOINT_GROUP]["noise_rng"].cpu())
