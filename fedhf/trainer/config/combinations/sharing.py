"""Refused combinations of parameter sharing, state syncs and the server rules that read LoRA factors: RoLoRA,
the optimizer's whole state, the LoRA layers a rule can read, heterogeneous client ranks
(fedhf/sharing/client_ranks.py), and rules that fold into the base weights."""

from __future__ import annotations

from typing import List

from ....core.lora import LORA_A, LORA_B, lora_pairs, role_of
from ....optim.whole_matrices import is_elementwise
from ....runtime.lora_layers import lora_layers
from ....sharing.alternating import ROLORA
from ....sharing.plan import PERSONAL, SHARED
from .refusal import SETTINGS, Refusal, Setup, batched, sharded

DESLOC_OPTIMIZERS = ("AdamW", "MuonAdamW", "Adam")  # the local optimizers whose moments DES-LOC averages
DESLOC_LOCAL_OPTIMIZERS = ("adamw", "muon")


def _trainable(s: Setup):
    from ....core.params import trainable_parameters
    return trainable_parameters(s.model)


def _adapter_rank(s: Setup) -> int:
    params = _trainable(s)
    return min(params[a].shape[0] for a in lora_pairs(params))


def _ranks(s: Setup) -> bool:
    return s.args.lora_client_ranks is not None


def _ranks_above(s: Setup) -> bool:
    pairs = lora_pairs(_trainable(s))
    return bool(pairs) and max(s.args.lora_client_ranks) > _adapter_rank(s)


ROWS: List[Refusal] = [
    # parameter sharing x server rule
    Refusal(lambda s: PERSONAL in s.sharing_roles.values() and s.rule.aggregator.needs_preconditioners,
            lambda s: f"`server_rule={s.rule.name!r}` mixes every preconditioned layer on the server, but "
                      "`parameter_sharing` keeps some of them personal; use parameter_sharing='all' or another "
                      "server_rule"),
    Refusal(lambda s: s.sharing.preset == ROLORA and not (any(role_of(n) == LORA_A for n in s.shared)
                                                          and any(role_of(n) == LORA_B for n in s.shared)),
            lambda s: "`parameter_sharing='rolora'` alternates shared LoRA A and B, but the model has no shared "
                      "trainable pair",
            "apply a peft LoRA adapter, or choose another `parameter_sharing`"),
    Refusal(lambda s: s.sharing.preset == ROLORA and s.needs_lora_pairs,
            lambda s: f"`parameter_sharing='rolora'` averages one factor per round; `server_rule={s.rule.name!r}` "
                      "aggregates the product of both. Use one or the other (e.g. server_rule='mean')"),
    # a state sync that keeps the optimizer's whole state (persist_local keep="state", desloc) reads the optimizer's
    # own per-parameter tensors (fedhf/optim/whole_state.py): RoLoRA's frozen-factor view and FSDP's optimizer over
    # gathered whole matrices have none to hand over
    Refusal(lambda s: s.algorithm.state_sync.moves == "state" and s.sharing.preset == ROLORA,
            lambda s: f"`state_sync={s.algorithm.state_sync.name!r}` keeps the optimizer's whole state, but "
                      "`parameter_sharing='rolora'` trains one LoRA factor per round through a view of the optimizer "
                      "that hands over Theta only",
            "use state_sync='reset' or 'persist_local' (keep='theta') with rolora, or another parameter_sharing"),
    # DES-LOC averages Adam's moments by their state names (exp_avg / momentum_buffer, exp_avg_sq): other optimizers'
    # states are other quantities (SOAP's moments live in each client's own eigenbasis, Sophia's curvature and
    # covariance_adam's P are never averaged), so the periods would not mean what DES-LOC says
    Refusal(lambda s: s.algorithm.state_sync.name == "desloc"
            and s.algorithm.local_optimizer.cls.__name__ not in DESLOC_OPTIMIZERS,
            lambda s: f"`state_sync='desloc'` averages Adam's first and second moments at their own periods, but "
                      f"{s.algorithm.local_optimizer.cls.__name__} keeps other state",
            f"use local_optimizer in {list(DESLOC_LOCAL_OPTIMIZERS)}, or state_sync='average_warmstart'"),
    Refusal(lambda s: s.algorithm.state_sync.moves == "state" and sharded(s)
            and not is_elementwise(s.algorithm.local_optimizer.cls),
            lambda s: f"`state_sync={s.algorithm.state_sync.name!r}` keeps the optimizer's whole state, but under "
                      f"`fsdp` {s.algorithm.local_optimizer.cls.__name__} steps gathered copies of whole matrices "
                      "whose state is not the shards'",
            "use an elementwise optimizer (adamw, sgd) or state_sync='reset' under fsdp"),
    # refuses DoRA, conv LoRA and LoRA on embeddings; fan_in_fan_out only for rules that write into W
    Refusal(lambda s: s.needs_lora_pairs,
            check=lambda s: lora_layers(s.model, allow_fan_in_fan_out=not s.rule.aggregator.folds_into_base)),
    Refusal(lambda s: s.needs_lora_pairs and not s.lora,
            lambda s: f"`server_rule={s.rule.name!r}` aggregates LoRA products, but the model has no trainable "
                      "LoRA A/B", "apply a peft LoRA adapter, or choose another server_rule"),
    Refusal(lambda s: s.needs_lora_pairs and any(s.sharing_roles[n] != SHARED for n in s.lora),
            lambda s: f"`server_rule={s.rule.name!r}` needs every LoRA A and B shared, but "
                      f"`parameter_sharing={s.sharing.preset!r}` keeps some personal or frozen; use "
                      "parameter_sharing='all' (or a personal head/norm) with it"),
    # heterogeneous client ranks (fedhf/sharing/client_ranks.py)
    Refusal(lambda s: _ranks(s) and not lora_pairs(_trainable(s)),
            lambda s: "`lora_client_ranks` truncates LoRA adapters, but the model has no shared LoRA A/B",
            "apply a peft LoRA adapter, or leave lora_client_ranks unset"),
    Refusal(lambda s: _ranks(s) and _ranks_above(s),
            lambda s: f"`lora_client_ranks` asks for rank {max(s.args.lora_client_ranks)}, above the adapter's rank "
                      f"{_adapter_rank(s)}",
            lambda s: "a client trains the first r_i components of the global adapter; use ranks <= "
                      f"{_adapter_rank(s)} or a larger LoraConfig(r=...)"),
    Refusal(lambda s: _ranks(s) and not s.needs_lora_pairs,
            lambda s: "`lora_client_ranks` needs a rule that aggregates the clients' products (flexlora, flora, "
                      f"fedex_lora, fedsvd); `server_rule={s.rule.name!r}` averages A and B, which would average "
                      "zeros into the components a client lacks",
            "use one of those rules (e.g. server_rule='flexlora') or leave lora_client_ranks unset"),
    # A client's optimizer state on the components it lacks is zero (they never get a gradient); averaged in, it
    # would shrink the others' (Adam's v: larger steps; momentum: smaller) on exactly those components.
    Refusal(lambda s: _ranks(s) and s.algorithm.state_sync.averages_theta,
            lambda s: f"`lora_client_ranks` with `state_sync={s.algorithm.state_sync.name!r}`: the averaged "
                      "optimizer state would mix a truncated client's zeros into the components it does not train; "
                      "use state_sync='persist_local' (each client keeps its own) or 'reset'"),
    Refusal(lambda s: _ranks(s) and batched(s),
            lambda s: f"`batched_clients={s.args.batched_clients}` trains clients together, but `lora_client_ranks` "
                      "truncates each client's adapter differently; set batched_clients=1", needs=SETTINGS),
    # a rule that folds into the base weights (FedEx-LoRA, FLoRA)
    Refusal(lambda s: s.rule.aggregator.folds_into_base and s.args.load_best_model_at_end,
            lambda s: "`load_best_model_at_end=True` keeps the best round's trainable tensors only, but "
                      "`server_rule` folds into the frozen base weights every round; set "
                      "load_best_model_at_end=False (or use round checkpoints) with it"),
]
