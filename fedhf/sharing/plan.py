"""Which trainable tensors are shared, personal or frozen: the fifth part of an algorithm (``parameter_sharing``).

* shared: federated as before (sent as dx, averaged, corrected, their optimizer state synced).
* personal: trained by each client and kept in the client state store under ``"personal"`` (so they spill to disk
  and are checkpointed with it), loaded into the resident model when that client trains; they never enter the
  round's sums: no dx, no Theta, no control variate, no uplink or downlink bytes.
* frozen: ``requires_grad`` is switched off before any optimizer is built.

The trainer federates only the shared tensors (its params dict *is* the shared part), so corrections, state sync,
drift metrics and byte counts never see the others. Presets (``parameter_sharing``), by LoRA role
(:func:`fedhf.core.lora.role_of`):

=================  ==========================================================================================
``all``            everything shared (the default; plain federated fine-tuning)
``fedsa``          A shared, B personal: FedSA-LoRA (Guo et al., ICLR 2025, "Selective Aggregation for Low-Rank
                   Adaptation in Federated Learning", arXiv:2410.01463). The client sends its *trained* A
                   (FedLLM-Factory's version uploads the untrained A).
``ffa``            A frozen at a seeded init shared by every client, B shared: FFA-LoRA (Sun et al., ICLR 2024,
                   "Improving LoRA in Privacy-preserving Federated Learning", arXiv:2403.12313). A is redrawn from
                   the run's ``seed`` (:func:`fedhf.core.lora.seeded_lora_a`), so no client ever sends or receives it.
``personal_head``  the head (peft ``modules_to_save``, ``classifier``, ``score``, ``lm_head``) personal: FedPer
                   (Arivazhagan et al. 2019, arXiv:1912.00818) / FedRep-style (Collins et al., ICML 2021).
``personal_norm``  normalisation layers (weights and running statistics) personal: FedBN (Li et al., ICLR 2021,
                   arXiv:2102.07623).
``rolora``         A and B shared, trained in alternate rounds (B in even rounds, A in odd ones): RoLoRA (Chen et
                   al., NeurIPS 2025, arXiv:2502.01755); see :mod:`fedhf.sharing.alternating`.
=================  ==========================================================================================

``parameter_sharing_kwargs`` = ``{"personal": [regex, ...], "frozen": [...], "shared": [...]}`` sets the role of
every trainable tensor whose name matches (``re.search``), after the preset.

The global model. After each round the resident model holds the global shared tensors and, as its personal part,
the weighted mean (by ``client_weighting``) of the latest personal tensors of every client that has trained
(:meth:`SharingPlan.load_global_personal`; the initial ones before any client has). That is what ``evaluate()``
evaluates and what ``save_model()``, ``push_to_hub()`` and the round checkpoints' model/ write: under FedSA-LoRA
W + s mean_i(p_i B_i) A, under ``personal_head`` the averaged head, under ``personal_norm`` the averaged
normalisation weights and statistics (the FedAvg of the personal part, done once for export; training never sees
it). Keeping the initial ones instead would make the global model of FedSA-LoRA exactly the base model (B = 0)
and that of ``personal_head`` an untrained head. Each client's own model is the global shared part plus its
personal tensors (``personalized_eval``; ``trainer.client_store.get(client_id, "personal")``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch

from ..core.sums import RoundSums
from .alternating import ROLORA, AlternatingFactors
from .client_ranks import ClientRanks
from ..core.lora import HEAD, LORA_A, LORA_B, NORM, role_of, seeded_lora_a
from ..core.params import TensorDict, federated_buffers, load_into, snapshot, trainable_parameters
from ..core.client_store import ClientStateStore
from ..core.theta import split_theta_key
from ..core.choices import not_one_of

SHARED, PERSONAL, FROZEN = "shared", "personal", "frozen"
PRESETS: Dict[str, Dict[str, str]] = {
    "all": {},
    "fedsa": {LORA_B: PERSONAL},
    "ffa": {LORA_A: FROZEN},
    "personal_head": {HEAD: PERSONAL},
    "personal_norm": {NORM: PERSONAL},
    ROLORA: {},  # every tensor shared; which LoRA factor trains alternates by round (fedhf/sharing/alternating.py)
}
STORE_NAME = "personal"  # the client store entry holding a client's personal tensors


@dataclass(frozen=True)
class ParameterSharing:
    preset: str = "all"
    patterns: Tuple[Tuple[str, str], ...] = ()  # (role, regex), applied in order after the preset

    @classmethod
    def from_config(cls, preset: str, kwargs: Mapping[str, object]) -> "ParameterSharing":
        """Checks the names and patterns (no model needed), naming the field."""
        if preset not in PRESETS:
            raise ValueError(not_one_of("parameter_sharing", preset, sorted(PRESETS)) + ".")
        patterns = []
        for role, regexes in kwargs.items():
            if role not in (SHARED, PERSONAL, FROZEN):
                raise ValueError(f"`parameter_sharing_kwargs` keys are 'shared', 'personal', 'frozen'; got {role!r}.")
            for regex in [regexes] if isinstance(regexes, str) else list(regexes):
                try:
                    re.compile(regex)
                except (re.error, TypeError) as err:
                    raise ValueError(f"`parameter_sharing_kwargs[{role!r}]`: {regex!r} is not a regular "
                                     f"expression ({err}).") from None
                patterns.append((role, regex))
        return cls(preset, tuple(patterns))

    def roles(self, model: torch.nn.Module) -> Dict[str, str]:
        """shared / personal / frozen for every trainable parameter; refuses a preset whose LoRA role the model
        lacks, a pattern that matches nothing, and a split that leaves nothing shared."""
        names = list(trainable_parameters(model))
        roles = {n: PRESETS[self.preset].get(role_of(n), SHARED) for n in names}
        for lora_role in PRESETS[self.preset]:
            if not any(role_of(n) == lora_role for n in names):
                hint = ("apply a peft LoRA adapter" if lora_role in (LORA_A, LORA_B) else
                        f"make the {lora_role} trainable (peft: modules_to_save)")
                raise ValueError(f"`parameter_sharing={self.preset!r}` acts on {lora_role} tensors, but no trainable "
                                 f"parameter of the model is one: {hint}, or choose another `parameter_sharing`.")
        for role, regex in self.patterns:
            matched = [n for n in names if re.search(regex, n)]
            if not matched:
                raise ValueError(f"`parameter_sharing_kwargs[{role!r}]`: {regex!r} matches no trainable parameter "
                                 f"(e.g. {names[:3]}).")
            roles.update({n: role for n in matched})
        if SHARED not in roles.values():
            raise ValueError("`parameter_sharing` leaves no trainable tensor shared: there is nothing to federate.")
        return roles

    def personal_buffers(self, model: torch.nn.Module, roles: Mapping[str, str]) -> TensorDict:
        """Floating-point buffers of personal layers (FedBN: BatchNorm running statistics stay with the client):
        those of the preset's personal LoRA role, or of a module one of whose parameters is personal."""
        personal_modules = {n.rsplit(".", 1)[0] for n, r in roles.items() if r == PERSONAL}
        preset_personal = {k for k, v in PRESETS[self.preset].items() if v == PERSONAL}
        return {n: b for n, b in federated_buffers(model).items()
                if role_of(n) in preset_personal or n.rsplit(".", 1)[0] in personal_modules}


class SharingPlan:
    """The split of one model, made at the start of ``train()``: frozen tensors frozen (FFA's A redrawn from the
    seed), the shared parameters and buffers the trainer federates, and the live personal tensors; with
    ``client_ranks`` (``lora_client_ranks``) each client trains the first r_i components of the shared adapter
    (:mod:`fedhf.sharing.client_ranks`). Each hook below does nothing when its part is off."""

    def __init__(self, sharing: ParameterSharing, roles: Mapping[str, str], model: torch.nn.Module,
                 seed: int, freeze_lora_a: bool = False, client_ranks: Optional[Sequence[int]] = None) -> None:
        live = dict(model.named_parameters())
        frozen = sorted(n for n, r in roles.items() if r == FROZEN)
        with torch.no_grad():
            if sharing.preset == "ffa":  # every client draws the same A from the run's seed
                for index, name in enumerate(n for n in frozen if role_of(n) == LORA_A):
                    live[name].copy_(seeded_lora_a(live[name].shape, seed, index))
            for name in frozen:
                live[name].requires_grad_(False)
        personal_buffers = sharing.personal_buffers(model, roles)
        self.params = {n: live[n] for n, r in roles.items() if r == SHARED}
        self.buffers = {n: b for n, b in federated_buffers(model).items() if n not in personal_buffers}
        self.personal = {**{n: live[n] for n, r in roles.items() if r == PERSONAL}, **personal_buffers}
        self._personal_params = {n: t for n, t in self.personal.items() if isinstance(t, torch.nn.Parameter)}
        self.frozen = frozen
        self.global_personal = snapshot(self.personal)  # the global model's personal part (initial until a round)
        # RoLoRA alternates the trained factor; a server rule that sets A itself (FedSVD) freezes A on clients.
        self.alternating = (AlternatingFactors(self.params) if sharing.preset == ROLORA else
                            AlternatingFactors(self.params, alternate=False) if freeze_lora_a else None)
        self.client_ranks = ClientRanks(client_ranks, self.params) if client_ranks else None

    def trained(self, shared: Optional[Dict[str, torch.nn.Parameter]] = None) -> Dict[str, torch.nn.Parameter]:
        """What the local optimizer steps: the client's shared parameters (default: the resident ones; a batched
        client's own copy otherwise) and the personal parameters (buffers are not trained)."""
        shared = self.params if shared is None else shared
        if self.alternating is not None:  # RoLoRA: this round's frozen factor is not trained
            shared = self.alternating.trained(shared)
        # Called on every local step (clipping): no new dict in the common case of nothing personal.
        return {**shared, **self._personal_params} if self._personal_params else shared

    def load_personal(self, store: ClientStateStore, client_id: int, initial: TensorDict) -> None:
        """The client's own personal tensors into the model, or the initial ones on its first round."""
        load_into(self.personal, store.get(client_id, STORE_NAME) or initial)

    def keep_personal(self, store: ClientStateStore, client_id: int) -> None:
        if self.personal:
            store.put(client_id, STORE_NAME, snapshot(self.personal))

    def load_global_personal(self, store: ClientStateStore, weights: Mapping[int, float], initial: TensorDict,
                             counts: bool = True, device: Optional[torch.device] = None) -> None:
        """The global model's personal part into the resident model: sum_i w_i P_i / sum_i w_i over the clients i
        with stored personal tensors P_i (``weights``: client id -> w_i), or ``initial`` while no client has any.
        ``counts``: whether this process's store counts (False on the processes that mirror another's clients,
        ``client_parallel``). Summed over processes (each holds its own clients' tensors), in float64; every
        process must call it; ``device``: the model's, where the sums are reduced (NCCL reduces GPU tensors only).
        Reads every client's personal tensors: N times their size per call."""
        if not self.personal:
            return
        sums = RoundSums()
        for client_id, weight in weights.items():
            mine = store.get(client_id, STORE_NAME) if counts else None
            if mine is not None:
                sums.add_tensors("p", mine, scale=weight)
                sums.add("w", weight)
        sums.all_reduce(device=device)
        total = sums.scalar("w")
        self.global_personal = ({n: (sums.get(f"p.{n}") / total).to(t.dtype) for n, t in initial.items()}
                                if total > 0 else dict(initial))
        load_into(self.personal, self.global_personal)

    def load_global_personal_again(self) -> None:
        """After a client's own personal tensors were loaded (personalised evaluation): the global ones back."""
        load_into(self.personal, self.global_personal)

    # RoLoRA's round (fedhf/sharing/alternating.py); without it, nothing changes from round to round.
    def begin_round(self, round_index: int) -> None:
        if self.alternating is not None:
            self.alternating.begin_round(round_index)

    def end_round(self) -> None:
        if self.alternating is not None:
            self.alternating.end_round()

    # lora_client_ranks (fedhf/sharing/client_ranks.py); without it, every client trains the whole adapter.
    def begin_client(self, client_id: int) -> None:
        """Before a client trains (or is evaluated): the components beyond its rank zeroed."""
        if self.client_ranks is not None:
            self.client_ranks.truncate(client_id)

    def after_step(self, client_id: int) -> None:
        """After each local step (after the correction's hooks): nothing revives the components beyond its rank."""
        if self.client_ranks is not None:
            self.client_ranks.truncate(client_id)

    def masks(self, client_id: int) -> Dict[str, torch.Tensor]:
        """The components the client trains, for the tensors some client trains in part (ClientContext.trained)."""
        return {} if self.client_ranks is None else self.client_ranks.masks(client_id)

    def trainers(self) -> Dict[str, torch.Tensor]:
        """How many clients train each component of those tensors (ServerContext.trainers)."""
        return {} if self.client_ranks is None else self.client_ranks.trainers()

    def sent_bytes(self, delta: TensorDict) -> Optional[int]:
        """Uplink bytes of the model change (None: all of it, Message's default)."""
        return None if self.alternating is None else self.alternating.sent_bytes(delta)

    def theta_target(self, optimizer):
        """What the state sync imports Theta into: the optimizer (RoLoRA: without the frozen factor's entries)."""
        return optimizer if self.alternating is None else self.alternating.without_frozen(optimizer)

    def frozen_now(self) -> frozenset:
        """The shared tensors no client trains this round (RoLoRA's other factor, FedSVD's A)."""
        return frozenset() if self.alternating is None else self.alternating.frozen

    def hold_frozen(self, new_params: TensorDict, old_params: TensorDict) -> TensorDict:
        return new_params if self.alternating is None else self.alternating.hold(new_params, old_params)

    def shared_theta(self, theta: TensorDict) -> TensorDict:
        """Theta without the entries of personal parameters (their optimizer state is never synced)."""
        return {k: v for k, v in theta.items() if split_theta_key(k)[1] not in self.personal}
