"""Client-level differential privacy and secure aggregation as one round hook (the math: fedhf/privacy/). The hook is
the adapter of the ``dp_mode``'s mechanism (fedhf/privacy/mechanisms/: what is clipped, where the noise is added and
how much, its accountant, what a round releases); it asks the mechanism and never names a mode.

Per client (``on_client_message``, after every hook that changes messages, so the clip bounds exactly what is
summed): every tensor the client sends, the trainer's ``dx``/``buf`` and every component's (correction, state sync,
server half), is clipped jointly to L2 norm C (under secure aggregation after padding the correction's declared
keys a client did not send with zeros: the secure sum needs one layout from every client); under distributed DP
the client adds its noise share; under secure aggregation the result is quantised and masked, after a check that
no element of the data lies outside the codec's range (a clamp would change the sum silently: the run stops naming
``secagg_range``). The drift diagnostics are not sent under DP; the client's training loss is not sent under DP or
secure aggregation (the history's ``train_loss`` is then NaN).

On the sums (``after_sums``, before any server half reads them): secure aggregation's sum is unmasked (dropped
clients' masks removed) and decoded; under central DP Gaussian noise of std z C is added to every protected sum
from the run's noise stream, in every round: a Poisson round with no client releases (0 + noise) / S on every key
(McMahan et al., ICLR 2018, Algorithm 1; the shapes are the global model's and the last round's messages'); the
weights' sums become the fixed denominator (the expected cohort, DP-FedAvg's data-independent W), so a server
half's mean is post-processing of the noisy sum. Under distributed DP a round with fewer than ``dp_min_survivors``
survivors (whose shares would carry less than the accounted noise) is not released.

After the round, ``dp_epsilon`` (dp-accounting, composed over the rounds done), ``dp_noise_multiplier`` and
``dp_clip_norm`` go into the round's log (history, plots, model card); under distributed DP also the epsilon
against the server, which knows the cohort (one participation, and a client in every round). With
``dp_stop_at_budget`` the run stops before a round would exceed ``dp_epsilon``, checked before the first round
(and after a resume) too. The accountant's round count, the adaptive C, the run's secret and the noise stream's
state are part of the round checkpoint, so a resumed run is bit-identical, noise included.

Every random draw of the mechanism (the cohorts under DP, through :meth:`Privacy.cohort_seed`; central noise,
secure aggregation's masks and rounding) comes from the run's secret (fedhf/privacy/secret.py): drawn from the
operating system's entropy on the main process and broadcast, never derived from the seed the model card prints
(unless ``dp_reproducible_noise``, for tests). A distributed-DP client's noise shares follow its own secret, kept
in the client store (the clients' devices), so the server's state cannot undo them. Under DP the round's log loses
what follows client data outside the noise (``WITHHELD``), and a user hook's additions are kept only where
declared (fedhf/trainer/hooks/user_hooks_under_dp.py).
"""

from __future__ import annotations

import logging
from typing import Dict, List, Tuple

import torch

from ...core.message import Message
from ...core.params import TensorDict
from ...core.schedule import stream_seed
from ...privacy import centred_bit
from ...privacy.secagg import masked_bytes
from ...privacy.secret import draw_secret
from ...runtime.processes import value_of_the_main_process
from .base import ClientMessages, RoundHook
from ..config.privacy_settings import dp_mechanism, dp_on, expected_cohort, min_survivors, secagg_codec

logger = logging.getLogger(__name__)

NOISE_STREAM = 0xD9  # the central noise's stream tag
COHORT_STREAM = 0xC0  # the sampled cohorts' stream tag (under DP)
SHARE_STREAM = 0xDA  # a client's distributed-noise share
CLIENT_SECRET = "dp_share_secret"  # the client store's name for a client's own share secret
UNSENT = ("drift", "dp", "secagg")  # diagnostics a deployment does not send, and this hook's own namespaces
CHECKPOINT_GROUP = "privacy"
# a round's log entries that follow client data outside the noisy sums, withheld under DP: how many clients had a
# non-finite loss or update, and this machine's wall-clock times (they follow the clients' row lengths)
WITHHELD = ("excluded_clients", "round_runtime", "compression_seconds")


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


def check_in_range(codec, items: Dict[str, torch.Tensor], ctx) -> None:
    """Secure aggregation clamps every element to the codec's range [-c, c]; an element of the data outside it
    would make the decoded sum another sum, silently, so the run stops naming the setting that fixes it."""
    outside, largest = codec.out_of_range(items)
    if outside:
        raise ValueError(f"round {ctx.round + 1}: client {ctx.client_id}'s message has {outside} element(s) outside "
                         f"secure aggregation's range [-{codec.clip_range:g}, {codec.clip_range:g}] (largest "
                         f"|value| {largest:.4g}); they would be clamped and the decoded sum would not be the sum: "
                         f"set secagg_range >= {largest:.4g} (e.g. {2 * largest:.3g}), or bound the messages with "
                         "dp_mode='central' and dp_clip_norm (the range is then C).")


def pad_to_layout(sent: ClientMessages, namespace: str, shapes: Dict[str, torch.Size], device: torch.device) -> None:
    """Secure aggregation sums one vector whose layout every client of the round shares: each pair's masks cancel,
    and the decoding subtracts one offset c per survivor, only on a key every survivor sent. A key of the layout a
    client has no value for (parameter tracking's ``dy`` outside Y_r) travels as zeros, as SecAgg's fixed-length
    vector would carry it; the plain sum is unchanged."""
    message = sent.components.setdefault(namespace, Message())
    for key, shape in shapes.items():
        if key not in message.tensors:
            message.tensors[key] = torch.zeros(shape, dtype=torch.float64, device=device)


def _is_weight(key: str) -> bool:
    return key == "w" or key.endswith(".w")


def _device(run) -> torch.device:
    """Where the round's sums live (the model's device); the CPU without a run (a hook used on its own)."""
    if run is None or not run.global_params:
        return torch.device("cpu")
    return next(iter(run.global_params.values())).device


class Privacy(RoundHook):
    """The round hook; does nothing when ``dp_mode='off'`` and ``secure_aggregation=False``."""

    def __init__(self, trainer) -> None:
        args = self.args = trainer.args
        self.dp, self.secure = dp_on(args), args.secure_aggregation
        self.mechanism = dp_mechanism(args) if self.dp else None  # the dp_mode's (fedhf/privacy/mechanisms/)
        self.z = self.mechanism.noise_multiplier() if self.dp else 0.0  # calibrated here, before any round
        self.z_sums = self.mechanism.sums_noise_multiplier(self.z) if self.dp else 0.0
        self.accountant = self.mechanism.accountant(self.z) if self.dp else None
        self.clip_norm = args.dp_clip_norm
        self.round_clip = self.clip_norm  # the C this round's clients clip with
        self.codec = secagg_codec(args, self.z_sums) if self.secure else None
        self.cohort: List[int] = []
        # the protected keys' shapes an empty round is noised on, beyond the global model's: the last messages'
        self.message_shapes: Dict[str, List[int]] = {}
        self.secret = 0
        self.noise = torch.Generator()  # the central noise's stream (the privacy audit draws from it too)
        if self.active:  # drawn on the main process, broadcast: every process adds the same noise
            self._use_secret(value_of_the_main_process(draw_secret(args.dp_reproducible_noise, args.seed)))

    def _use_secret(self, secret: int) -> None:
        """Every draw of the mechanism from now on follows ``secret`` (every process holds the same one)."""
        self.secret = int(secret)
        self.noise.manual_seed(stream_seed(self.secret, NOISE_STREAM))
        if self.codec is not None:
            self.codec.seed = self.secret

    @property
    def active(self) -> bool:
        return self.dp or self.secure

    def cohort_seed(self) -> int:
        """The seed the loop samples each round's clients from. Under DP the secret's own stream: amplification by
        sampling holds only against someone who does not know the sample, and the card prints ``seed``. Otherwise
        (and with ``dp_reproducible_noise``, which voids the guarantee) the run's ``seed``."""
        if self.dp and not self.args.dp_reproducible_noise:
            return stream_seed(self.secret, COHORT_STREAM)
        return self.args.seed

    # ---------------------------------------------------------------- the client side
    def on_train_begin(self, trainer, run) -> None:
        if self.dp and self.mechanism.noise_on_clients:  # every client's share secret now, none after a checkpoint
            for client in range(self.args.num_clients):
                if trainer.world.owns(client):
                    self._client_secret(trainer.client_store, client)
        if self.next_round_over_budget():  # the first round, or the next one of a resumed run
            logger.warning("dp_stop_at_budget: the next round would spend epsilon %.4g > dp_epsilon=%s; no round is "
                           "run", self.accountant.epsilon(self.accountant.rounds + 1), self.args.dp_epsilon)
            trainer.control.should_training_stop = True

    def before_round(self, trainer, run) -> None:
        self.cohort = list(run.started)  # the clients that began the round: the secure sum's mask partners
        self.round_clip = self.clip_norm

    def on_client_message(self, trainer, ctx, sent: ClientMessages) -> ClientMessages:
        if not self.active:
            return sent
        # the drift metric reads each Theta_i outside the clipped, noised and masked sums: not computed
        sent.components.pop("drift", None)
        sent.own.tensors.pop("loss", None)  # a 0-d value of the client's data: neither released nor masked
        if self.secure:  # before the clip and the noise share: the zeros are summed with noise like any key
            pad_to_layout(sent, "correction", trainer.algorithm.correction.sent_shapes(ctx.global_params),
                          next(iter(ctx.global_params.values())).device)
        items = {k: v for k, v in full_items(sent).items() if protected(k, v)}
        if self.dp:
            items, norm = self.mechanism.clip(items, self.round_clip)
        if self.secure:  # the data, before any noise share: a clamped element would change the sum silently
            check_in_range(self.codec, items, ctx)
        if self.dp:
            if self.mechanism.noise_on_clients:
                items = self._noise_share(items, ctx)
            if self.mechanism.adaptive:  # Andrew et al.: b_i, summed; the mechanism noises the count
                sent.components["dp"] = Message().put_scalar("below", centred_bit(norm, self.round_clip))
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
        """The mechanism's noise share (distributed DP: N(0, (z C)^2 / S_min) per element), from the client's own
        secret; S_min or more shares sum to at least z C."""
        std = self.mechanism.client_noise_std(self.z_sums, self.round_clip)
        secret = self._client_secret(ctx.store, ctx.client_id)
        generator = torch.Generator().manual_seed(stream_seed(secret, SHARE_STREAM, ctx.round))
        return self.mechanism.noised(items, std, generator)

    def _client_secret(self, store, client_id: int) -> int:
        """A client's own secret for its noise shares: drawn from the operating system's entropy when the run
        begins (:meth:`on_train_begin`, every client of this process at once, as devices would at enrolment) and
        kept in the client store, which models the clients' devices, so the server's state (its checkpoint's
        privacy.safetensors) never holds what would undo the clients' noise. The store is checkpointed with the run,
        so a resumed run is bit-identical: no client draws after a checkpoint. With ``dp_reproducible_noise``: from
        the seed."""
        stored = store.get(client_id, CLIENT_SECRET)
        if stored is None:
            reproducible = stream_seed(self.args.seed, SHARE_STREAM, client_id)
            stored = {"secret": torch.tensor([draw_secret(self.args.dp_reproducible_noise, reproducible)])}
            store.put(client_id, CLIENT_SECRET, stored)
        return int(stored["secret"][0])

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
        sums.set("loss", float("nan"))  # not sent (on_client_message)
        keys = sorted(k for k, v in sums.items() if protected(k, v))
        if self.secure and sums.has("secagg.present"):
            self._unmask(sums, keys, run.rounds_done)
        if not self.dp:
            return
        if not self.mechanism.releases(sums.scalar("n")):
            self._withhold(sums, keys, run)
            return
        if keys:  # what an empty round is noised on, next time
            self.message_shapes = {k: list(sums.get(k).shape) for k in keys}
            self.message_shapes.update({k: [] for k, v in sums.items() if _is_weight(k) and v.dim() == 0})
        if self.mechanism.noise_on_server:  # from the run's noise stream, on every key in sorted order
            std = self.mechanism.server_noise_std(self.z_sums, self.round_clip)
            shapes = {k: list(sums.get(k).shape) for k in keys} if keys else self._empty_round_shapes(trainer, run)
            values = {key: sums.get(key) if key in keys else torch.zeros(shapes[key], dtype=torch.float64,
                                                                          device=_device(run)) for key in shapes}
            for key, value in self.mechanism.noised(values, std, self.noise).items():
                sums.set(key, value)
        weights = {k for k, v in sums.items() if _is_weight(k) and v.dim() == 0}
        weights |= {k for k, shape in self.message_shapes.items() if _is_weight(k)} | {"w"}
        for key in weights:  # the fixed denominator: w_i = 1, W = the expected cohort, an empty round's too
            sums.set(key, float(expected_cohort(self.args)))
        if self.mechanism.adaptive:  # the noised count of centred bits (unshifted by S/2 in the update)
            self.clip_norm = self.mechanism.next_clip_norm(self.round_clip, sums.scalar("dp.below"), self.noise)

    def _empty_round_shapes(self, trainer, run) -> Dict[str, List[int]]:
        """A round no client sent in (Poisson) is noised on every protected key: the global model's (``dx``,
        ``buf``), the correction's (SCAFFOLD's ``dc``, tracking's ``dy``: they mirror the global model, so they are
        known before any client sent, and an empty first round is noised on them too) and the components' keys of
        the last round that had messages."""
        shapes = {k: v for k, v in self.message_shapes.items() if not _is_weight(k)}
        if run is not None:
            shapes.update({f"dx.{n}": list(t.shape) for n, t in run.global_params.items()})
            shapes.update({f"buf.{n}": list(t.shape) for n, t in run.global_buffers.items()})
            shapes.update({f"correction.{k}": list(shape) for k, shape in
                           trainer.algorithm.correction.sent_shapes(run.global_params).items()})
        return shapes

    def _withhold(self, sums, keys: List[str], run) -> None:
        """Distributed DP with fewer survivors than ``dp_min_survivors``: their shares carry less than the accounted
        noise, so the round's sum is not released (every sum zeroed, no weight: the global model stays)."""
        logger.warning("round %d: %d client(s) survived, fewer than dp_min_survivors=%d, whose noise shares would be "
                       "below the accounted noise: the round's sum is not released (lower dp_min_survivors to "
                       "tolerate dropouts; each share then carries more noise)", (run.rounds_done + 1) if run else 0,
                       int(sums.scalar("n")), min_survivors(self.args))
        for key, value in sums.items():
            if key in keys or _is_weight(key):
                sums.set(key, torch.zeros_like(value))
        sums.set("w", 0.0)
        sums.set("loss", float("nan"))

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
        for key in WITHHELD:
            entry.pop(key, None)
        entry.update({"dp_epsilon": self.accountant.step(), "dp_noise_multiplier": self.z,
                      "dp_clip_norm": self.round_clip})
        entry.update(self.mechanism.release_report(self.accountant))  # e.g. the epsilon against a server that
        # knows the cohort (distributed DP)

    def after_round(self, trainer, run, entry: dict) -> bool:
        return self.next_round_over_budget()

    def next_round_over_budget(self) -> bool:
        """``dp_stop_at_budget``: whether the next round would spend more than ``dp_epsilon`` (the run stops after
        this round, which is then evaluated as a last round is)."""
        if not (self.dp and self.args.dp_stop_at_budget and self.args.dp_epsilon is not None):
            return False
        return self.accountant.epsilon(self.accountant.rounds + 1) > self.args.dp_epsilon

    def checkpoint_state(self, trainer, run) -> Tuple[dict, Dict[str, TensorDict]]:
        """The server's secret state (never in the model, card or history): the secret, the noise stream, and
        under DP the accountant's rounds, the adaptive C and the shapes an empty round is noised on."""
        if not self.active:
            return {}, {}
        groups = {CHECKPOINT_GROUP: {"secret": torch.tensor([self.secret], dtype=torch.int64),
                                     "noise_rng": self.noise.get_state()}}
        if not self.dp:
            return {}, groups
        meta = {"privacy": {"rounds": self.accountant.rounds, "clip_norm": self.clip_norm,
                            "message_shapes": self.message_shapes}}
        return meta, groups

    def restore_state(self, trainer, run, meta: dict, groups: Dict[str, TensorDict]) -> None:
        if not self.active:
            return
        state = groups.get(CHECKPOINT_GROUP, {})
        if "secret" in state:
            self._use_secret(int(state["secret"][0]))
        elif not self.args.dp_reproducible_noise:  # (reproducible: the secret is the seed, as that run's was)
            raise ValueError("The checkpoint holds no privacy secret (written before fedhf kept one): the rest of the "
                             "run's noise, shares and masks would follow the seed the card prints. Start a new run, "
                             "or resume with dp_reproducible_noise=True (no privacy guarantee; the card says so).")
        if not self.dp:
            return
        if "privacy" not in meta or "noise_rng" not in state:
            raise ValueError("The checkpoint holds no privacy accountant state (it was written without DP): resume "
                             "it with dp_mode='off', or start a new run.")
        self.accountant.rounds = int(meta["privacy"]["rounds"])
        self.clip_norm = float(meta["privacy"]["clip_norm"])
        self.message_shapes = dict(meta["privacy"].get("message_shapes", {}))
        self.noise.set_state(state["noise_rng"].cpu())
