"""batched_clients = C: C clients' adapters stacked on one resident base, one forward/backward over their
concatenated batches. The global model must equal sequential training (float tolerance: the base runs on a
larger, padded batch) for every algorithm it supports, with rows of different lengths, clients whose last batch
is short, micro-batching and a trainable head; what it cannot do is refused before any work."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model

from fedhf import FederatedTrainer
from fedhf.runtime.stacked_adapters import Routing, StackedLinear, concat_batches
from fedhf.data.sft import SFTCollator

from tests.helpers import config, lora_minilm, tiny_llama_lora, trainable_state, tweet_sft, tweet_trainer


@pytest.fixture(scope="module")
def sft(tokenizer):
    return tweet_sft(tokenizer, n_train=90, n_test=8, max_length=40)  # 90 rows over 6 clients: short last batches


def _llm_run(tmp_path, tokenizer, sft, batched, forwards=None, **overrides):
    model = tiny_llama_lora(len(tokenizer))
    if forwards is not None:  # count the passes over the frozen base, and the rows each carries
        model.base_model.model.model.register_forward_hook(
            lambda module, args, kwargs, output: forwards.append(len(kwargs["input_ids"])), with_kwargs=True)
    settings = dict(algorithm="fedavg", num_clients=6, clients_per_round=5, num_rounds=2, local_steps=3,
                    per_device_train_batch_size=4, partition="iid", learning_rate=0.05, batched_clients=batched,
                    partition_report=False)
    settings.update(overrides)
    args = config(tmp_path / f"b{batched}", **settings)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=sft["train"],
                               data_collator=SFTCollator(tokenizer))
    trainer.train()
    return trainable_state(model), trainer.federated_history


def _assert_same_run(a, b, atol=2e-5):
    (state_a, history_a), (state_b, history_b) = a, b
    for name in state_a:
        torch.testing.assert_close(state_b[name], state_a[name], rtol=0, atol=atol, msg=name)
    for h_a, h_b in zip(history_a, history_b):
        assert h_a["participants"] == h_b["participants"] and h_a["uplink_MB"] == h_b["uplink_MB"]
        assert h_a["train_loss"] == pytest.approx(h_b["train_loss"], abs=1e-5)


@pytest.mark.parametrize("algorithm, overrides", [
    ("fedavg", {}),
    ("scaffold", {}),  # a correction with per-client state in the store
    ("fedpac_muon", {"learning_rate": 1e-3}),  # Muon + global-direction mixing + averaged momentum
    ("fadam_gt", {"learning_rate": 1e-3}),  # AMSGrad + gradient tracking + persistent per-client v_hat
    ("fedpac_sophia", {"learning_rate": 1e-3}),  # Sophia's curvature probe runs per client, routed to its copy
    ("local_adamw", {"learning_rate": 1e-3}),
    ("fedpm", {}),  # FOOF: its statistics' forward passes hook the client's own copies
])
def test_causal_lm_clients_together_equal_clients_one_by_one(tmp_path, tokenizer, sft, algorithm, overrides):
    sequential = _llm_run(tmp_path, tokenizer, sft, 1, algorithm=algorithm, **overrides)
    together = _llm_run(tmp_path, tokenizer, sft, 3, algorithm=algorithm, **overrides)  # chunks of 3 and 2
    _assert_same_run(sequential, together)
    start = trainable_state(tiny_llama_lora(len(tokenizer)))
    assert any(not torch.allclose(start[n], sequential[0][n]) for n in start)  # the adapter did train


def test_muon_clients_of_a_chunk_orthogonalise_in_one_batched_call(tmp_path, tokenizer, sft, monkeypatch):
    """Local Muon with BatchedMuon's iterations (newton_schulz="batched"; "gram" steps the same way): batched, every step's Newton-Schulz iterations of a chunk run as
    one batched call over all its clients' matrices -- 8 LoRA factors per client (q/v, A and B, 2 layers), all of
    the oriented shape 4 x 64 -- and the run equals clients one by one."""
    from fedhf.optim import newton_schulz_pool

    stacked, iterate = [], newton_schulz_pool.batched_newton_schulz
    monkeypatch.setattr(newton_schulz_pool, "batched_newton_schulz",
                        lambda updates, *args: stacked.append(len(updates)) or iterate(updates, *args))
    settings = dict(algorithm="local_muon", learning_rate=1e-3, local_optimizer_kwargs={"newton_schulz": "batched"})
    sequential = _llm_run(tmp_path, tokenizer, sft, 1, **settings)
    assert stacked == [8] * (2 * 5 * 3)  # alone: one call per step for its own 8 factors
    stacked.clear()
    together = _llm_run(tmp_path, tokenizer, sft, 3, **settings)
    assert stacked == ([3 * 8] * 3 + [2 * 8] * 3) * 2  # per round: 3 steps of a chunk of 3, then of a chunk of 2
    _assert_same_run(sequential, together)


def test_personal_evaluation_runs_a_chunks_clients_through_their_copies_in_one_forward(tmp_path, tokenizer, sft):
    """personalized_eval with batched clients: each step of the evaluation carries the held-out rows of a chunk's
    clients in one stacked forward, and each client's loss is what Trainer's evaluation loop gives over its rows
    alone (the one-at-a-time path), also for a client whose rows run out first (an empty block) and beside a
    client without rows (skipped)."""
    from fedhf.trainer.hooks.personal_eval import evaluate_rows

    model, forwards = tiny_llama_lora(len(tokenizer)), []
    model.base_model.model.model.register_forward_hook(
        lambda module, args, kwargs, output: forwards.append(len(kwargs["input_ids"])), with_kwargs=True)
    args = config(tmp_path, algorithm="fedavg", num_clients=6, clients_per_round=5, num_rounds=1, local_steps=1,
                  per_device_train_batch_size=4, partition="iid", learning_rate=0.05, batched_clients=3,
                  partition_report=False, personalized_eval=True, client_eval_fraction=0.2,
                  per_device_eval_batch_size=2)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=sft["train"], data_collator=SFTCollator(tokenizer))
    held_out = trainer.client_eval_partitions
    assert all(len(rows) == 3 for rows in held_out)
    held_out[1], held_out[4] = held_out[1][:1], held_out[4][:0]  # 1 row (one batch, then empty); none (skipped)
    trainer.train()
    # training: chunks of 3 and 2 clients (2 forwards); evaluation: clients 0-2 (3 rows in 2 batches; client 1: 1
    # row), then clients 3, 5 (3 rows each): 2 forwards per chunk
    assert forwards[2:] == [2 + 1 + 2, 1 + 0 + 1, 2 + 2, 1 + 1]
    entry = trainer.federated_history[-1]
    assert entry["personal_eval_clients"] == 5 and entry["personal_eval_skipped"] == 1
    for client, metrics in trainer.personal_eval_per_client.items():
        alone = evaluate_rows(trainer, held_out[client])  # the global model is each client's own
        assert metrics["loss"] == pytest.approx(alone["loss"], rel=1e-6)


def test_the_clients_really_share_each_forward(tmp_path, tokenizer, sft):
    """2 rounds x 3 steps: one at a time, 5 clients make 30 passes of <= 4 rows; together, chunks of 3 and 2
    make 12 passes carrying the same 5 clients' rows."""
    one, together = [], []
    _llm_run(tmp_path, tokenizer, sft, 1, forwards=one)
    _llm_run(tmp_path, tokenizer, sft, 3, forwards=together)
    assert len(one) == 30 and max(one) <= 4
    assert len(together) == 12 and max(together) > 4 and sum(together) == sum(one)


def test_micro_batches_with_different_token_counts_per_client(tmp_path, tokenizer, sft):
    """Each client's step is the per-token mean over its own micro-batches, whatever the others hold."""
    overrides = dict(gradient_accumulation_steps=2, per_device_train_batch_size=3, max_grad_norm=0.5)
    _assert_same_run(_llm_run(tmp_path, tokenizer, sft, 1, **overrides),
                     _llm_run(tmp_path, tokenizer, sft, 5, **overrides))


@pytest.mark.parametrize("algorithm", ["scaffold", "fed_sophia"])
def test_minilm_classifier_with_a_trainable_head(tmp_path, minilm, tweets, tokenizer, algorithm):
    """LoRA + the classification head (modules_to_save) copied per client; rows padded to the longest client's."""
    def run(batched):
        model = lora_minilm(minilm, dropout=False)
        args = config(tmp_path / f"c{batched}", algorithm=algorithm, num_clients=4, clients_per_round=4,
                      num_rounds=2, local_steps=2, per_device_train_batch_size=8, batched_clients=batched,
                      partition_report=False)
        trainer = tweet_trainer(model, tweets, tokenizer, args, evaluate=False)
        trainer.train()
        return trainable_state(model), trainer.federated_history

    sequential, together = run(1), run(4)
    assert any("classifier" in name for name in sequential[0])
    _assert_same_run(sequential, together)


@pytest.mark.parametrize("segments", [[(0, 2), (2, 5)], [(0, 3), (3, 6)]])  # a short block padded; equal blocks
def test_each_copy_gets_only_its_own_rows_gradient(segments):
    torch.manual_seed(0)
    linear = torch.nn.Linear(5, 3)
    routing = Routing(segments)
    stacked = StackedLinear(linear, 2, routing)
    rows = segments[-1][1]
    x = torch.randn(rows, 40, 5)  # rows x positions x features, as LoRA's A sees them
    (stacked(x) ** 2).sum().backward()
    stacked.grads_to_copies()
    assert stacked.stacked_weight.grad is None  # released: the next pass accumulates afresh
    for c, (start, stop) in enumerate(routing.segments):
        alone = torch.nn.Linear(5, 3)
        alone.load_state_dict(linear.state_dict())
        (alone(x[start:stop]) ** 2).sum().backward()
        torch.testing.assert_close(stacked.copies[c].weight.grad, alone.weight.grad, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(stacked.copies[c].bias.grad, alone.bias.grad, rtol=1e-6, atol=1e-6)
    with torch.no_grad():  # a client's optimizer steps its copy in place: the stacked weight is that storage
        stacked.copies[1].weight.add_(1.0)
    torch.testing.assert_close(stacked.stacked_weight[1], linear.weight + 1.0)
    torch.testing.assert_close(stacked.stacked_weight[0], linear.weight)
    routing.only(1, 2, rows)  # a client's own pass: every row through its copy
    assert routing.segments == [(0, 0), (0, rows)] and routing.client == 1
    torch.testing.assert_close(stacked(x), stacked.copies[1](x))
    routing.route(segments)
    assert routing.client is None


def test_a_stacked_linear_runs_the_same_ops_whatever_the_number_of_clients():
    """One batched matmul per linear, fixed-size gathers: the aten ops of a forward/backward do not grow with C."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    def ops(copies: int) -> int:
        segments = [(3 * c, 3 * c + 3) for c in range(copies - 1)] + [(3 * copies - 3, 3 * copies - 1)]  # one short
        stacked = StackedLinear(torch.nn.Linear(5, 3), copies, Routing(segments))
        x = torch.randn(3 * copies - 1, 4, 5, requires_grad=True)
        with Count() as count:
            stacked(x).sum().backward()
        return count.ops

    assert ops(2) == ops(8) == ops(32)


def test_concatenation_pads_on_the_right_with_the_pad_id_and_records_each_clients_rows():
    a = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
         "labels": torch.tensor([[-100, 6, 7]])}
    b = {"input_ids": torch.tensor([[8], [9]]), "attention_mask": torch.ones(2, 1, dtype=torch.long),
         "labels": torch.tensor([[8], [9]])}
    batch, routing = concat_batches([a, b], pad_id=102)
    assert routing.segments == [(0, 1), (1, 3)]
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 102, 102], [9, 102, 102]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100], [9, -100, -100]]
    del a["attention_mask"], b["attention_mask"]
    with pytest.raises(ValueError, match="attention_mask"):
        concat_batches([a, b])


def test_packed_batches_of_different_widths_pad_as_documents_of_their_own():
    """Packed rows (no attention mask): input_ids with the pad id, labels with -100, position_ids with 0, so each
    padding token starts a document that attends only to itself and carries no label."""
    a = {"input_ids": torch.tensor([[5, 6, 7]]), "labels": torch.tensor([[-100, 6, 7]]),
         "position_ids": torch.tensor([[0, 1, 0]]), "use_cache": False}
    b = {"input_ids": torch.tensor([[8]]), "labels": torch.tensor([[8]]), "position_ids": torch.tensor([[0]]),
         "use_cache": False}
    batch, routing = concat_batches([a, b], pad_id=102)
    assert routing.segments == [(0, 1), (1, 2)] and "attention_mask" not in batch
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 102, 102]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 0], [0, 0, 0]]


def test_packed_sft_clients_together_equal_clients_one_by_one(tmp_path, tokenizer):
    """Packing per category leaves each category's last block short: a client holding one gets a narrower batch
    than the others in its shared pass."""
    from fedhf.data.sft import tokenize_sft
    from fedhf.data.demo import load_tweet_instructions, subsample

    packed = {"train": tokenize_sft(subsample(load_tweet_instructions()["train"], 16), tokenizer, max_length=64,
                                    packing=True, group_column="label")}
    assert len({len(ids) for ids in packed["train"]["input_ids"]}) > 1  # blocks of different widths
    overrides = dict(num_clients=4, clients_per_round=4, per_device_train_batch_size=1, local_steps=2, num_rounds=1)
    _assert_same_run(_llm_run(tmp_path, tokenizer, packed, 1, **overrides),
                     _llm_run(tmp_path, tokenizer, packed, 2, **overrides))


def test_a_forward_flag_all_clients_share_passes_through_and_a_disagreement_is_refused():
    """The packing collator (fedhf.data.sft) adds ``use_cache=False`` to every batch (without it transformers
    would let packed documents attend to each other): the one shared pass gets it once."""
    rows = {"input_ids": torch.tensor([[5, 6]]), "labels": torch.tensor([[5, 6]]),
            "position_ids": torch.tensor([[0, 1]])}
    batch, _ = concat_batches([{**rows, "use_cache": False}, {**rows, "use_cache": False}])
    assert batch["use_cache"] is False and batch["position_ids"].tolist() == [[0, 1], [0, 1]]
    with pytest.raises(ValueError, match="use_cache"):
        concat_batches([{**rows, "use_cache": False}, {**rows, "use_cache": True}])


def test_a_decoder_classifier_with_a_non_zero_pad_id_trains_the_same_together(tmp_path, tokenizer):
    """LlamaForSequenceClassification pools the rightmost token that is not ``config.pad_token_id``; padding a
    shorter client's rows with anything else would pool a padding position. Pad here is [SEP] (id 102)."""
    from datasets import DatasetDict
    from transformers import DataCollatorWithPadding, LlamaConfig, LlamaForSequenceClassification

    from fedhf.data.demo import load_tweets, subsample, tokenize_tweets

    tok = copy.deepcopy(tokenizer)
    tok.pad_token = "[SEP]"
    assert tok.pad_token_id != 0
    data = tokenize_tweets(DatasetDict(train=subsample(load_tweets()["train"], 24, seed=0)), tok, max_length=64)["train"]

    def run(batched):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, num_labels=3, pad_token_id=tok.pad_token_id)
        model = get_peft_model(LlamaForSequenceClassification(cfg),
                               LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS"))
        args = config(tmp_path / f"p{batched}", num_clients=2, clients_per_round=2, num_rounds=1, local_steps=2,
                      per_device_train_batch_size=3, partition="iid", learning_rate=0.05, batched_clients=batched,
                      partition_report=False)
        FederatedTrainer(model=model, args=args, train_dataset=data, data_collator=DataCollatorWithPadding(tok)).train()
        return trainable_state(model)

    sequential, together = run(1), run(2)
    for name in sequential:
        torch.testing.assert_close(together[name], sequential[name], rtol=0, atol=2e-6, msg=name)


@pytest.mark.parametrize("overrides, message", [
    ({"neftune_noise_alpha": 5.0}, "neftune_noise_alpha"),
    ({"label_smoothing_factor": 0.1}, "label_smoothing_factor"),
])
def test_what_cannot_share_a_pass_is_refused_before_work(tmp_path, tokenizer, sft, overrides, message):
    args = config(tmp_path, batched_clients=2, num_clients=2, clients_per_round=2, partition="iid", **overrides)
    with pytest.raises(ValueError, match=f"batched_clients=2.*{message}.*batched_clients=1"):
        FederatedTrainer(model=tiny_llama_lora(len(tokenizer)), args=args, train_dataset=sft["train"],
                         data_collator=SFTCollator(tokenizer))
    run = tmp_path / "run"
    assert not run.exists() or not any(run.iterdir())  # nothing written


def test_non_linear_trainable_modules_are_refused(tmp_path, tokenizer, sft):
    model = get_peft_model(tiny_llama_lora(len(tokenizer)).base_model.model,
                           LoraConfig(r=2, target_modules=["embed_tokens"], task_type=TaskType.CAUSAL_LM))
    args = config(tmp_path, batched_clients=2, num_clients=2, clients_per_round=2, partition="iid")
    with pytest.raises(ValueError, match="embed_tokens.*batched_clients=1"):
        FederatedTrainer(model=model, args=args, train_dataset=sft["train"], data_collator=SFTCollator(tokenizer))


def test_batched_clients_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="batched_clients"):
        config(tmp_path, batched_clients=0)


class _ZeroLoss(FederatedTrainer):
    """A user's compute_loss override (here a loss that trains nothing): the shared pass could not run it."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch) * 0.0


def test_an_overridden_compute_loss_is_refused_before_work(tmp_path, tokenizer, sft):
    args = config(tmp_path, batched_clients=2, num_clients=2, clients_per_round=2, partition="iid")
    with pytest.raises(ValueError, match="batched_clients=2.*compute_loss.*_ZeroLoss.*batched_clients=1"):
        _ZeroLoss(model=tiny_llama_lora(len(tokenizer)), args=args, train_dataset=sft["train"],
                  data_collator=SFTCollator(tokenizer))
    model = tiny_llama_lora(len(tokenizer))
    start = trainable_state(model)
    one = _ZeroLoss(model=model, args=config(tmp_path / "one", num_clients=2, clients_per_round=2, partition="iid",
                                             num_rounds=1, weight_decay=0.0, learning_rate=0.1),
                    train_dataset=sft["train"], data_collator=SFTCollator(tokenizer))
    one.train()  # one client at a time runs the override: a zero loss leaves the adapter where it was
    for name, value in trainable_state(model).items():
        torch.testing.assert_close(value, start[name], rtol=0, atol=0, msg=name)


class _CountedSteps(FederatedTrainer):
    """A user's ``_local_steps`` override (the documented per-client seam): batched chunks never call it."""

    def _local_steps(self, ctx, optimizer):
        return super()._local_steps(ctx, optimizer)


def test_an_overridden_local_steps_is_refused_with_batched_clients(tmp_path, tokenizer, sft):
    args = config(tmp_path, batched_clients=2, num_clients=2, clients_per_round=2, partition="iid")
    with pytest.raises(ValueError, match="batched_clients=2.*_local_steps.*_CountedSteps.*steps the chunk"):
        _CountedSteps(model=tiny_llama_lora(len(tokenizer)), args=args, train_dataset=sft["train"],
                      data_collator=SFTCollator(tokenizer))


def test_trls_sft_trainer_with_batched_clients_is_refused_naming_the_fix(tmp_path, tokenizer):
    from datasets import Dataset

    from fedhf.data.demo import tiny_llama
    from fedhf.trainer.sft import FederatedSFTConfig, FederatedSFTTrainer

    data = Dataset.from_dict({"prompt": ["Tweet: good\nSentiment:"] * 8,
                                                     "completion": [" positive"] * 8})
    args = FederatedSFTConfig(output_dir=str(tmp_path / "run"), report_to="none", use_cpu=True, bf16=False,
                              gradient_checkpointing=False, eos_token="[SEP]", num_clients=2, clients_per_round=2,
                              partition="iid", batched_clients=2, save_strategy="no", eval_every_rounds=0)
    model = get_peft_model(tiny_llama(len(tokenizer)), LoraConfig(r=2, target_modules=["q_proj"],
                                                                  task_type=TaskType.CAUSAL_LM))
    with pytest.raises(ValueError, match="compute_loss.*SFTTrainer.*batched_clients=1"):
        # a copy: trl sets the eos_token on the tokenizer it is given (the session's tokenizer is shared)
        FederatedSFTTrainer(model=model, args=args, train_dataset=data, processing_class=copy.deepcopy(tokenizer))


def test_a_chunks_dropout_draws_new_masks_at_every_local_step(tmp_path):
    """LoRA dropout 0.5, 2 clients trained together for 4 steps: each step's mask is a new draw (not the first
    step's replayed), the clients' blocks differ, and about half the entries drop."""
    from datasets import Dataset
    from transformers import default_data_collator

    from fedhf.data.demo import tiny_llama

    model = get_peft_model(tiny_llama(64), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=["q_proj"],
                                                      task_type=TaskType.CAUSAL_LM))
    dropout = model.base_model.model.model.layers[0].self_attn.q_proj.lora_dropout["default"]
    masks = []
    dropout.register_forward_hook(lambda m, i, o: masks.append((o == 0) & (i[0] != 0)) if m.training else None)
    ids = torch.randint(1, 64, (16, 16), generator=torch.Generator().manual_seed(0)).tolist()
    data = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 16] * 16, "labels": ids})
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=1, local_steps=4, batched_clients=2,
                  per_device_train_batch_size=4, partition="iid", learning_rate=0.05, partition_report=False)
    FederatedTrainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator).train()
    assert len(masks) == 4 and all(m.shape[0] == 8 for m in masks)  # one shared pass per step, 2 x 4 rows
    assert not any(torch.equal(masks[a], masks[b]) for a in range(4) for b in range(a + 1, 4))
    assert not any(torch.equal(m[:4], m[4:]) for m in masks)
    assert all(abs(float(m.float().mean()) - 0.5) < 0.03 for m in masks)


def _half_labelled_rows(n: int = 60):
    """Rows of 16 random tokens, the first 8 unlabelled (prompt-like), the last 8 labelled."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)
    ids, labels = [], []
    for _ in range(n):
        k = int(torch.randint(16, 17, (), generator=g))
        row = torch.randint(1, 128, (k,), generator=g).tolist()
        ids.append(row)
        labels.append([-100] * (k // 2) + row[k // 2:])
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 16] * n, "labels": labels})


def _pooled_muon_run(tmp_path, batched: int, marker: str = "") -> dict:
    """fedpac_muon with the Newton-Schulz pool, a tiny untied Llama with LoRA on 4 modules, clients of 3 and 11 rows,
    2 local steps (REVIEW B.10's setting)."""
    from transformers import LlamaConfig, LlamaForCausalLM, default_data_collator

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                        tie_word_embeddings=False, pad_token_id=0, bos_token_id=None,
                                        eos_token_id=None))
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type=TaskType.CAUSAL_LM,
                                            target_modules=["q_proj", "v_proj", "o_proj", "gate_proj"]))
    args = config(tmp_path / f"pool{batched}{marker}", algorithm="fedpac_muon", learning_rate=1e-3, num_clients=2,
                  clients_per_round=2, num_rounds=1, local_steps=2, max_grad_norm=0.0, per_device_train_batch_size=4,
                  batched_clients=batched, partition="iid", partition_report=False,
                  local_optimizer_kwargs={"newton_schulz": "batched"})
    FederatedTrainer(model=model, args=args, train_dataset=_half_labelled_rows(), data_collator=default_data_collator,
                     client_partitions=[list(range(3)), list(range(3, 14))]).train()
    return trainable_state(model)


def test_the_newton_schulz_pool_equals_sequential_clients_to_the_documented_tolerance(tmp_path, monkeypatch):
    """docs/scaling.md: with float32-accumulated products (default_matmul's choice on CPUs without bfloat16 matmul
    units) the pooled call is batch-invariant here, bit for bit; with bfloat16 matmuls (GPUs, AVX512-BF16 / AMX
    CPUs) it is not, and a chunk is within 1e-3 of sequential clients after these 2 steps."""
    from fedhf.optim import muon_batched, newton_schulz_pool

    if muon_batched.default_matmul(torch.device("cpu")) == "bfloat16":
        sequential, together = _pooled_muon_run(tmp_path, 1), _pooled_muon_run(tmp_path, 2)
        for name in sequential:
            torch.testing.assert_close(together[name], sequential[name], rtol=0, atol=1e-3, msg=name)
    for module in (muon_batched, newton_schulz_pool):  # float32-accumulated products, whatever this CPU has
        monkeypatch.setattr(module, "default_matmul", lambda device: "float32_accumulate")
    exact = [_pooled_muon_run(tmp_path, b, marker="f32") for b in (1, 2)]
    assert all(torch.equal(exact[0][n], exact[1][n]) for n in exact[0])


def _rows_of_lengths(n: int, lo: int, hi: int):
    """n rows of lo..hi random tokens, the first half of each unlabelled, unpadded."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)
    ids, labels = [], []
    for _ in range(n):
        k = int(torch.randint(lo, hi + 1, (), generator=g))
        row = torch.randint(1, 128, (k,), generator=g).tolist()
        ids.append(row)
        labels.append([-100] * (k // 2) + row[k // 2:])
    return Dataset.from_dict({"input_ids": ids, "labels": labels})


def _pad_each_batch(batch):
    """Each batch padded on the right to its own longest row (as DataCollatorWithPadding pads)."""
    length = max(len(r["input_ids"]) for r in batch)

    def pad(seq, value):
        return seq + [value] * (length - len(seq))

    return {"input_ids": torch.tensor([pad(r["input_ids"], 0) for r in batch]),
            "attention_mask": torch.tensor([pad([1] * len(r["input_ids"]), 0) for r in batch]),
            "labels": torch.tensor([pad(r["labels"], -100) for r in batch])}


def _muon_run_on_lengths(tmp_path, batched: int, lo: int, hi: int) -> dict:
    """fedpac_muon, 4 clients of 3, 11, 16 and 30 rows, 2 rounds x 3 steps x 2 micro-batches (REVIEW B.11)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                        tie_word_embeddings=False, pad_token_id=0, bos_token_id=None,
                                        eos_token_id=None))
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type=TaskType.CAUSAL_LM,
                                            target_modules=["q_proj", "v_proj", "o_proj", "gate_proj"]))
    args = config(tmp_path / f"lengths{batched}_{lo}_{hi}", algorithm="fedpac_muon", learning_rate=1e-3,
                  num_clients=4, clients_per_round=4, num_rounds=2, local_steps=3, gradient_accumulation_steps=2,
                  max_grad_norm=0.5, per_device_train_batch_size=4, batched_clients=batched, partition="iid",
                  partition_report=False)
    parts = [list(range(0, 3)), list(range(3, 14)), list(range(14, 30)), list(range(30, 60))]
    FederatedTrainer(model=model, args=args, train_dataset=_rows_of_lengths(60, lo, hi), data_collator=_pad_each_batch,
                     client_partitions=parts).train()
    return trainable_state(model)


def test_batched_muon_with_batches_of_different_lengths_is_within_the_documented_tolerance(tmp_path):
    """docs/scaling.md: batches of one length run the base on the client's own shapes (bit for bit); batches
    padded each to its own longest row run it on the chunk's longest, and Muon amplifies that rounding: within
    2e-3 of sequential clients here (1.3e-3 measured)."""
    same = [_muon_run_on_lengths(tmp_path, b, 16, 16) for b in (1, 4)]
    assert all(torch.equal(same[0][n], same[1][n]) for n in same[0])
    sequential, together = (_muon_run_on_lengths(tmp_path, b, 4, 20) for b in (1, 4))
    for name in sequential:
        torch.testing.assert_close(together[name], sequential[name], rtol=0, atol=2e-3, msg=name)
