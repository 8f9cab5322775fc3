"""The head only at labelled positions: the same loss and gradients as the full forward, on real tweets."""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fedhf.data.sft import SFTCollator
from fedhf.runtime.labelled_logits import (PROVEN_CAUSAL_LMS, at_labelled_positions, labelled_positions,
                                           predicts_at_positions)
from tests.helpers import IdsOnly, answer_rows, config, lora_minilm, tiny_llama_lora, tweet_sft


def _batch(tokenizer, rows: int = 6):
    data = tweet_sft(tokenizer, n_train=rows, n_test=1)["train"]
    batch = SFTCollator(tokenizer)([data[i] for i in range(rows)])
    return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}


def _loss_and_grads(model, inputs, **kwargs):
    model.zero_grad()
    out = model(**inputs, **kwargs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_same_loss_and_gradients_as_every_position(tokenizer):
    model = tiny_llama_lora(len(tokenizer))
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # away from peft's zero start, so lora_A has a gradient too
            param.data.normal_(0, 0.1)
    batch = _batch(tokenizer)
    assert batch["labels"].eq(-100).float().mean() > 0.5, "a SFT batch: prompts and padding carry no label"
    for items in (None, batch["labels"][:, 1:].ne(-100).sum()):
        extra = {} if items is None else {"num_items_in_batch": items}
        full, full_grads = _loss_and_grads(model, batch, **extra)
        kept, kept_grads = _loss_and_grads(model, at_labelled_positions(batch), **extra)
        most = int(batch["labels"][:, 1:].ne(-100).sum(1).max())
        rows, width = batch["labels"].shape
        assert most < width // 2  # one logit row per row's labelled token (shorter rows padded to the most)
        assert kept.logits.shape == (rows, most, full.logits.shape[-1])
        assert full.logits.shape[:2] == batch["labels"].shape
        torch.testing.assert_close(kept.loss, full.loss, rtol=1e-5, atol=1e-6)
        for name, grad in full_grads.items():  # to 1e-5 of the tensor's largest gradient (float32 rounding)
            assert grad.abs().max() > 0, name
            assert (kept_grads[name] - grad).abs().max() <= 1e-5 * grad.abs().max(), name


def test_left_alone_when_labels_are_not_per_token_or_positions_are_chosen():
    rows = {"input_ids": torch.ones(2, 4, dtype=torch.long), "labels": torch.tensor([0, 1])}
    assert at_labelled_positions(rows) is rows
    chosen = {"input_ids": torch.ones(2, 4, dtype=torch.long), "labels": torch.ones(2, 4, dtype=torch.long),
              "logits_to_keep": 1}
    assert at_labelled_positions(chosen) is chosen


def test_only_causal_lms_with_the_standard_loss(minilm, tokenizer):
    assert predicts_at_positions(tiny_llama_lora(len(tokenizer)))
    assert not predicts_at_positions(lora_minilm(minilm))  # a classifier: its logits are per row


# A tiny config for every allowed architecture: the fields each config has are set, the others left alone.
_TINY = dict(vocab_size=128, hidden_size=32, n_embd=32, d_model=32, num_hidden_layers=1, n_layer=1, num_layers=1,
             num_attention_heads=4, n_head=4, num_key_value_heads=2, intermediate_size=64, n_inner=64, ffn_dim=64,
             head_dim=8, max_position_embeddings=64, n_positions=64, pad_token_id=0, num_local_experts=2,
             num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32, word_embed_proj_dim=32, rotary_dim=4,
             sliding_window=16)


def _tiny_causal_lm(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type)
    for key, value in _TINY.items():
        if hasattr(cfg, key) and not isinstance(getattr(type(cfg), key, None), property):  # a derived value: left
            setattr(cfg, key, value)
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[:cfg.num_hidden_layers]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).float().eval()


def test_every_allowed_causal_lm_gives_its_own_loss():
    """The allow-list's proof: each architecture, built tiny, has the same loss with the cut as with every
    position, on rows whose prompts are unlabelled and whose answers differ in length."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 128, (3, 12), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, 8:] = ids[:, 8:]
    labels[1, 10:] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    for name, model_type in PROVEN_CAUSAL_LMS.items():
        model = _tiny_causal_lm(model_type)
        assert type(model).__name__ == name and predicts_at_positions(model), name
        with torch.no_grad():
            full, kept = model(**batch), model(**at_labelled_positions(batch))
        most = int(labels[:, 1:].ne(-100).sum(1).max())  # a row's labelled positions, at most
        assert kept.logits.shape[:2] == (3, most) and most < ids.shape[1], name  # the cut was taken
        torch.testing.assert_close(kept.loss, full.loss, rtol=1e-5, atol=1e-6, msg=name)


def test_a_causal_lm_that_computes_its_loss_by_hand_keeps_every_position():
    """XLNet (like Bart, Marian, Pegasus, ...) slices its logits and is named a causal LM, but computes its loss by
    hand: given the cut it would fail; it is not in the allow-list."""
    model = _tiny_causal_lm("xlnet")
    assert type(model).__name__ == "XLNetLMHeadModel" and not predicts_at_positions(model)


def test_peft_prompt_learning_keeps_every_position(tmp_path):
    """peft prepends virtual tokens the labels' mask does not have: prompt tuning and P-tuning are not cut, and the
    default config trains them (it crashed in the first local step)."""
    from peft import PromptEncoderConfig, PromptTuningConfig, TaskType, get_peft_model

    from fedhf import FederatedTrainer
    from fedhf.data.demo import tiny_llama

    p_tuning = get_peft_model(tiny_llama(100), PromptEncoderConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4,
                                                                   encoder_hidden_size=16))
    assert not predicts_at_positions(p_tuning)
    model = get_peft_model(tiny_llama(100), PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4))
    assert not predicts_at_positions(model)
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=1, local_steps=1,
                  per_device_train_batch_size=4, learning_rate=0.05, partition="iid")
    trainer = FederatedTrainer(model=model, args=args, train_dataset=answer_rows(8),
                               data_collator=SFTCollator(IdsOnly()))
    assert trainer.args.logits_at_labels_only and not trainer.labelled_logits
    trainer.train()
    assert trainer.federated_history[-1]["participants"] == 2


def test_the_trainer_trains_with_it_and_can_be_told_not_to(tokenizer, tmp_path):
    from fedhf import FederatedTrainer

    data = tweet_sft(tokenizer, n_train=24, n_test=8)
    losses, projected = {}, {}
    for flag in (True, False):
        args = config(tmp_path / str(flag), logits_at_labels_only=flag, num_clients=2, clients_per_round=2,
                      num_rounds=1, local_steps=2, per_device_train_batch_size=4, learning_rate=0.05)
        trainer = FederatedTrainer(model=tiny_llama_lora(len(tokenizer)), args=args, train_dataset=data["train"],
                                   eval_dataset=data["test"], data_collator=SFTCollator(tokenizer))
        assert trainer.labelled_logits is flag
        rows = []  # the positions the vocabulary projection saw, per call
        trainer.model.get_base_model().lm_head.register_forward_hook(
            lambda module, args, out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
        trainer.train()
        losses[flag] = (trainer.federated_history[-1]["train_loss"], trainer.evaluate()["eval_loss"])
        projected[flag] = sum(rows)
    assert projected[True] * 3 < projected[False]  # the answer tokens only: a few of each row's ~20-40
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), rtol=1e-4, atol=1e-5)


def test_per_row_losses_at_labelled_positions_equal_the_full_ones(tokenizer):
    """What batched clients sum per client: each row's loss, from the labelled positions' logits only."""
    from fedhf.runtime.labelled_logits import labelled_positions, row_losses_at
    from fedhf.runtime.stacked_adapters import row_losses

    model = tiny_llama_lora(len(tokenizer))
    batch = _batch(tokenizer)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    positions, shift_labels = labelled_positions(batch["labels"])
    with torch.no_grad():
        full = row_losses(model(**inputs).logits, batch["labels"], shifted=True)
        kept = row_losses_at(model(**inputs, logits_to_keep=positions).logits, shift_labels)
    assert (full > 0).all()
    torch.testing.assert_close(kept, full, rtol=1e-5, atol=1e-5)


def test_positions_are_fixed_size_gathers_in_order_with_ignored_padding():
    labels = torch.tensor([[-100, -100, 7, 8, -100],
                           [-100, 5, -100, -100, 9],
                           [-100, -100, -100, -100, -100]])
    positions, shift_labels = labelled_positions(labels)
    assert positions.shape == shift_labels.shape == (3, 2)  # the most any row has
    assert positions[0].tolist() == [1, 2] and shift_labels[0].tolist() == [7, 8]  # position t predicts t + 1
    assert positions[1].tolist() == [0, 3] and shift_labels[1].tolist() == [5, 9]
    assert shift_labels[2].tolist() == [-100, -100]  # nothing labelled: padding the loss ignores
    everywhere = torch.arange(12).view(2, 6)  # every position labelled: the full head, no gathers
    assert at_labelled_positions({"labels": everywhere}).keys() == {"labels"}


class _Ops(TorchDispatchMode):
    """The aten ops a block runs, and those indexed by a boolean mask (a data-dependent shape)."""

    def __init__(self):
        super().__init__()
        self.names, self.masked = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.names.append(name)
        indices = args[1] if name in ("index", "index_put", "index_put_") and len(args) > 1 else ()
        if any(torch.is_tensor(i) and i.dtype == torch.bool for i in indices):  # a mask as the index, not the data
            self.masked.append(name)
        if name == "_local_scalar_dense":  # a tensor read on the host: only transformers' own attention-mask
            files = [frame.filename for frame in traceback.extract_stack()]  # check (Trainer's step makes it too)
            if not any(f.endswith("masking_utils.py") for f in files):
                self.masked.append(name)
        return func(*args, **(kwargs or {}))


def test_the_training_forward_and_loss_read_no_data_dependent_shape(tokenizer):
    """No host sync on the hot path: no nonzero, no boolean-mask indexing, in the forward, the loss and the
    backward (on a GPU each would wait for the device to learn a shape)."""
    model = tiny_llama_lora(len(tokenizer))
    inputs = at_labelled_positions(_batch(tokenizer))  # on the host batch, as ClientRound does
    ops = _Ops()
    with ops:
        model(**inputs).loss.backward()
    assert "mm" in ops.names or "addmm" in ops.names  # the mode saw the pass
    assert not {"nonzero", "masked_select", "masked_scatter"} & set(ops.names)
    assert ops.masked == []
