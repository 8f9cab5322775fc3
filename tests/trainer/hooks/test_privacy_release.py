"""What a DP run releases and how it samples (REVIEW Part A, second privacy pass), on the tiny BERT: the cohorts
follow the run's secret, not the printed seed (N1); a user hook's additions to the log are withheld unless declared
(N4); no exclusion count (N3); no drift under secure aggregation (N9); the denominator is the accounted cohort
under Poisson + over-selection (N11); an empty first Poisson round is noised on the correction's keys too (N12); a
checkpoint without a secret is refused (S2)."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch

from fedhf import RoundHook
from fedhf.core.schedule import round_clients, stream_seed
from fedhf.core.sums import RoundSums
from fedhf.privacy import adaptive_clip_update
from fedhf.privacy.mechanisms import MECHANISMS
from fedhf.trainer.hooks.privacy import CHECKPOINT_GROUP, COHORT_STREAM, Privacy
from tests.tiny_bert import tiny_config, tiny_run

DP = dict(dp_mode="central", dp_clip_norm=0.05, dp_noise_multiplier=1.0)
POISSON = dict(num_clients=8, clients_per_round=2, client_sampling="poisson", max_excluded_rounds=0)


class Cohorts(RoundHook):
    def __init__(self):
        self.cohorts = []

    def before_round(self, trainer, run):
        self.cohorts.append(sorted(run.cohort))


def _cohorts(tmp_path, name, **settings):
    spy = Cohorts()
    trainer = tiny_run(tmp_path, name, round_hooks=[spy], num_rounds=4, **POISSON, **settings)
    return spy.cohorts, trainer


def test_under_dp_the_cohorts_follow_the_secret_not_the_printed_seed(tmp_path):
    from_seed = [sorted(round_clients(0, r, 8, 2, "poisson")) for r in range(4)]
    plain, _ = _cohorts(tmp_path, "plain")
    first, trainer = _cohorts(tmp_path, "dp1", **DP)
    second, _ = _cohorts(tmp_path, "dp2", **DP)
    assert plain == from_seed
    secret_seed = stream_seed(trainer.privacy.secret, COHORT_STREAM)
    assert first == [sorted(round_clients(secret_seed, r, 8, 2, "poisson")) for r in range(4)]
    assert first != from_seed and first != second  # one seed, two runs: two secrets, two samples
    reproducible, _ = _cohorts(tmp_path, "dp3", dp_reproducible_noise=True, **DP)
    assert reproducible == from_seed  # for tests only: the card says there is no guarantee


class Norms(RoundHook):
    """A user hook as the example's: one client's update norm (client data) and a declared public count."""

    released_under_dp = ("rounds_seen",)

    def __init__(self):
        self.norms, self.rounds = [], 0

    def on_client_message(self, trainer, ctx, sent):
        self.norms.append(float(sum(t.double().pow(2).sum() for k, t in sent.own.tensors.items()
                                    if k.startswith("dx.")).sqrt()))
        return sent

    def after_aggregate(self, trainer, run, sums, entry):
        self.rounds += 1
        entry.update({"update_norm_max": max(self.norms), "rounds_seen": self.rounds})

    def after_round(self, trainer, run, entry):
        entry["late_norm"] = min(self.norms)
        return False


def _history_file(trainer):
    with open(os.path.join(trainer.args.output_dir, "federated_history.json")) as f:
        return json.load(f)


def test_under_dp_a_user_hooks_log_is_withheld_unless_declared_and_nothing_counts_exclusions(tmp_path, caplog):
    plain = tiny_run(tmp_path, "plain", round_hooks=[Norms()])
    assert {"update_norm_max", "late_norm", "rounds_seen", "excluded_clients"} <= set(plain.federated_history[-1])
    private = tiny_run(tmp_path, "dp", round_hooks=[Norms()], **DP)
    for history in (private.federated_history, _history_file(private)):
        assert [h["rounds_seen"] for h in history] == [1, 2]
        assert not {"update_norm_max", "late_norm", "excluded_clients"} & set().union(*history)
    assert sum("'update_norm_max' is not written" in r.message for r in caplog.records) == 1  # once per key


def test_the_example_hook_under_dp_releases_only_its_blocklist_count(tmp_path):
    from examples.round_hook_update_norms import UpdateNorms

    trainer = tiny_run(tmp_path, round_hooks=[UpdateNorms(blocklist=[0])], **DP)
    keys = set().union(*trainer.federated_history)
    assert "blocked_clients_total" in keys and not {"update_norm_median", "update_norm_max"} & keys


def test_secure_aggregation_computes_no_drift(tmp_path):
    trainer = tiny_run(tmp_path, algorithm="fedmuon", secure_aggregation=True, secagg_range=100.0, num_rounds=1,
                       num_clients=2, clients_per_round=2)
    assert not [k for k in trainer.federated_history[-1] if "drift" in k]


def _after_sums(args, present: int, bit: float = 0.0):
    hook = Privacy(types.SimpleNamespace(args=args))
    hook.noise.manual_seed(0)
    sums = RoundSums()
    sums.add("dx.p", torch.zeros(3, dtype=torch.float64))
    for _ in range(present):
        sums.add("w", 1.0)
        sums.add("n", 1.0)
        sums.add("dp.below", bit)
    hook.after_sums(None, types.SimpleNamespace(rounds_done=0, global_params={}), sums)
    return hook, sums


def test_dp_poisson_with_over_selection_divides_by_the_accounted_cohort(tmp_path):
    clock = dict(clock_profile="uniform", round_policy="deadline", round_deadline_s=100.0)
    args = tiny_config(tmp_path, num_clients=20, clients_per_round=3, client_sampling="poisson", over_selection=1.0,
                       **clock, **DP)
    _, sums = _after_sums(args, present=7)
    assert sums.scalar("w") == 6.0  # S' = ceil(2 x 3) = q N, not S = 3
    fixed = tiny_config(tmp_path, num_clients=20, clients_per_round=3, over_selection=1.0, **clock, **DP)
    assert _after_sums(fixed, present=3)[1].scalar("w") == 3.0  # fixed: at most S reports are kept
    adaptive = tiny_config(tmp_path, num_clients=20, clients_per_round=3, client_sampling="poisson",
                           over_selection=1.0, dp_adaptive_clip_quantile=0.5, dp_adaptive_clip_count_std=3.0,
                           **clock, **{**DP, "dp_noise_multiplier": 5.0})
    hook, _ = _after_sums(adaptive, present=6, bit=0.0)  # the centred bits' sum 0: half the clients below C
    generator = torch.Generator().manual_seed(0)  # the hook's draws: the sum's 3 values, then the count's
    torch.randn(3, generator=generator, dtype=torch.float64)
    noisy = 0.0 + 3.0 * float(torch.randn((), generator=generator, dtype=torch.float64))
    assert hook.clip_norm == adaptive_clip_update(0.05, noisy, 6, 0.5, 0.2) != adaptive_clip_update(0.05, noisy, 3,
                                                                                                      0.5, 0.2)


class CorrectionState(RoundHook):
    def __init__(self):
        self.norms = []

    def after_aggregate(self, trainer, run, sums, entry):
        self.norms.append(float(sum(t.double().pow(2).sum() for t in run.correction_state.values()).sqrt()))


@pytest.mark.parametrize("algorithm", ["scaffold", "fadam_gt"])
def test_an_empty_first_poisson_round_is_noised_on_the_corrections_keys(tmp_path, algorithm):
    """seed 5 (dp_reproducible_noise: the cohorts of round_clients(5, ...)): cohort sizes 0, 1. SCAFFOLD stopped
    with MissingSum in round 1; FAdam-GT's tracking state stayed exactly 0 (un-noised)."""
    assert [len(round_clients(5, r, 8, 1, "poisson")) for r in range(2)] == [0, 1]
    spy = CorrectionState()
    trainer = tiny_run(tmp_path, algorithm=algorithm, num_clients=8, clients_per_round=1, client_sampling="poisson",
                       num_rounds=2, seed=5, max_excluded_rounds=0, dp_reproducible_noise=True, round_hooks=[spy],
                       **DP)
    assert len(trainer.federated_history) == 2
    assert spy.norms[0] > 0 and spy.norms[1] != spy.norms[0]  # round 1 (empty) noised the correction's state


def test_a_checkpoint_without_a_secret_is_refused(tmp_path):
    hook = Privacy(types.SimpleNamespace(args=tiny_config(tmp_path, **DP)))
    meta = {"privacy": {"rounds": 1, "clip_norm": 0.05, "message_shapes": {}}}
    with pytest.raises(ValueError, match="no privacy secret.*seed the card prints"):
        hook.restore_state(None, None, meta, {CHECKPOINT_GROUP: {"noise_rng": hook.noise.get_state()}})
    reproducible = Privacy(types.SimpleNamespace(args=tiny_config(tmp_path, dp_reproducible_noise=True, **DP)))
    reproducible.restore_state(None, None, meta, {CHECKPOINT_GROUP: {"noise_rng": hook.noise.get_state()}})
    assert reproducible.secret == 0  # the seed, as that run's was


def _tokens(tmp_path, lengths, **settings):
    from datasets import Dataset

    from fedhf.trainer.hooks.clock import tokens_per_round

    data = Dataset.from_dict({"input_ids": [[1] * n for n in lengths]})
    trainer = types.SimpleNamespace(args=tiny_config(tmp_path, clock_profile="uniform", **settings),
                                    train_dataset=data, client_partitions=[[0, 1], [2, 3]])
    return tokens_per_round(trainer)


def test_under_dp_the_clock_counts_no_clients_own_row_lengths(tmp_path):
    """Client 0's rows long and client 1's short, or the reverse: without DP each client's compute time follows
    its own rows; under DP both count the training set's mean length, so who is slow, dropped or late (and the
    withheld round of distributed DP) does not single out a client's data (N2, N6)."""
    rows = 8  # K G B: 1 x 1 x 8
    assert _tokens(tmp_path, [12, 12, 8, 8]) == [12.0 * rows, 8.0 * rows]
    assert _tokens(tmp_path, [8, 8, 12, 12]) == [8.0 * rows, 12.0 * rows]
    assert _tokens(tmp_path, [12, 12, 8, 8], **DP) == _tokens(tmp_path, [8, 8, 12, 12], **DP) == [10.0 * rows] * 2


def test_distributed_shares_do_not_follow_anything_the_server_keeps(tmp_path):
    """N7: the server's secret (its checkpoint's privacy.safetensors) regenerated every client's share, so whoever
    held the server's state could subtract the noise. Now each client's share follows its own secret, kept in the
    client store (the clients' devices)."""
    from fedhf.core.client_store import ClientStateStore
    from fedhf.trainer.hooks.privacy import CLIENT_SECRET, SHARE_STREAM

    args = tiny_config(tmp_path, dp_mode="distributed", dp_clip_norm=0.5, dp_noise_multiplier=1.0,
                       secure_aggregation=True)

    def share(hook, store, client=0):
        ctx = types.SimpleNamespace(round=0, client_id=client, store=store)
        return hook._noise_share({"dx.a": torch.zeros(1000, dtype=torch.float64)}, ctx)["dx.a"]

    hook, store = Privacy(types.SimpleNamespace(args=args)), ClientStateStore()
    mine = share(hook, store)
    std = 0.5 / 2  # z C / sqrt(S_min = 4)
    for server_guess in (stream_seed(hook.secret, SHARE_STREAM, 0, 0), stream_seed(hook.secret, SHARE_STREAM, 0)):
        regenerated = std * torch.randn(1000, generator=torch.Generator().manual_seed(server_guess),
                                        dtype=torch.float64)
        assert not torch.allclose(regenerated, mine)
    assert torch.equal(share(hook, store), mine)  # the client's own secret, kept: a resumed run repeats it
    assert not torch.equal(share(hook, ClientStateStore()), mine)  # same server secret, another device: other noise
    secret = int(store.get(0, CLIENT_SECRET)["secret"][0])
    _, groups = hook.checkpoint_state(None, None)
    assert secret not in [int(v.flatten()[0]) for v in groups[CHECKPOINT_GROUP].values() if v.numel() == 1]
    reproducible = tiny_config(tmp_path, dp_mode="distributed", dp_clip_norm=0.5, dp_noise_multiplier=1.0,
                               secure_aggregation=True, dp_reproducible_noise=True)
    one, two = (Privacy(types.SimpleNamespace(args=reproducible)) for _ in range(2))
    assert torch.equal(share(one, ClientStateStore()), share(two, ClientStateStore()))


# docs/privacy.md, "What is released": every key of a DP run's round log (the simulated clock's included)
RELEASED = {"round", "learning_rate", "train_loss", "participants", "uplink_MB", "downlink_MB", "communicated_MB",
            "dp_epsilon", "dp_noise_multiplier", "dp_clip_norm", "processes"}
CLOCK_COLUMNS = {"sim_round_s", "sim_time_s", "sim_dropped", "sim_offline", "sim_wasted_client_s"}


def test_a_dp_runs_log_holds_exactly_what_the_docs_list_as_released(tmp_path):
    trainer = tiny_run(tmp_path, num_rounds=1, clock_profile="uniform", uplink_compression="int8", **DP)
    assert set(_history_file(trainer)[0]) == RELEASED | CLOCK_COLUMNS
    assert all(h["train_loss"] != h["train_loss"] for h in trainer.federated_history)  # NaN: the loss is not sent
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "privacy.md")).read()
    released = doc[doc.index("## What is released"):doc.index("Not released under DP")]
    assert all(f"`{key}`" in released for key in RELEASED | CLOCK_COLUMNS)


# what each mechanism's release_report adds to a round's log beside dp_epsilon (docs/privacy.md lists these too)
REPORTED = {"central": set(), "distributed": {"dp_epsilon_vs_server_one_round", "dp_epsilon_vs_server_every_round"}}


@pytest.mark.parametrize("mode", sorted(MECHANISMS))
def test_every_mechanisms_log_holds_exactly_what_the_docs_list_as_released(tmp_path, mode):
    """The central test above, for every registered mechanism: a mechanism's ``release_report`` writes keys into the
    log, and each must be in the docs' released list (before: distributed DP's two epsilons against the server were
    written but not listed)."""
    settings = {**DP, "dp_mode": mode, **({"secure_aggregation": True} if MECHANISMS[mode].needs_secure_aggregation
                                         else {})}
    trainer = tiny_run(tmp_path, num_rounds=1, **settings)
    assert set(_history_file(trainer)[0]) == RELEASED | REPORTED[mode]
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "privacy.md")).read()
    released = doc[doc.index("## What is released"):doc.index("Not released under DP")]
    assert all(f"`{key}`" in released for key in RELEASED | REPORTED[mode])


def test_a_distributed_dp_run_resumed_after_a_checkpoint_is_bit_identical_when_clients_join_later(tmp_path):
    """Every client's share secret is drawn when the run begins: a client first sampled after the checkpoint (8
    clients, 4 a round) would otherwise draw another secret on resume than in the uninterrupted run."""
    from fedhf.state import load_checkpoint
    from fedhf.trainer.hooks.privacy import CLIENT_SECRET

    common = dict(num_clients=8, clients_per_round=4, num_rounds=3, save_strategy="rounds", save_every_rounds=1,
                  dp_clip_norm=0.05, dp_noise_multiplier=1.0, dp_mode="distributed", secure_aggregation=True)
    full = tiny_run(tmp_path, "full", **common)
    groups, _ = load_checkpoint(str(tmp_path / "full" / "checkpoint-1"))
    assert len({k.split("/")[0] for k in groups["client_store"] if CLIENT_SECRET in k}) == 8
    resumed = tiny_run(tmp_path, "resumed", resume=str(tmp_path / "full" / "checkpoint-1"), **common)
    after, again = (({n: p.detach() for n, p in t.model.named_parameters() if p.requires_grad}) for t in (full, resumed))
    assert all(torch.equal(after[n], again[n]) for n in after)


def test_under_secure_aggregation_a_hook_may_not_add_clients_to_the_sample(tmp_path):
    """The masks are agreed between the sampled clients before training: an added client's would cancel against
    no partner's (the decoded sum 2.7e3 off), so adding one is refused, naming the clients."""
    class AlwaysClientSeven(RoundHook):
        def select_clients(self, trainer, run, clients):
            return list(clients) + ([7] if 7 not in clients else [])

    tiny_run(tmp_path, "plain", num_clients=8, clients_per_round=2, num_rounds=1, round_hooks=[AlwaysClientSeven()])
    with pytest.raises(ValueError, match=r"added clients \[7\] that were not sampled"):
        tiny_run(tmp_path, "secure", num_clients=8, clients_per_round=2, num_rounds=1, secure_aggregation=True,
                 secagg_range=1.0, round_hooks=[AlwaysClientSeven()])
