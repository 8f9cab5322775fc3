"""The LLM path on a real pretrained LLM: Gemma-3-270M (bundled-gemma-3-270m, the llm-demo extra) with LoRA on
the bundled tweets as instructions. Small budgets (a few local steps, 16-row evaluations): what is checked is that
the path works on a real 268 M-parameter model with its 262 K vocabulary, its tokenizer and a chat template, not
how well it learns (benchmarks/ and ``make demo-llm`` say that)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model

from fedhf import FederatedTrainer
from fedhf.data.demo import load_tweet_instructions, subsample
from fedhf.data.sft import SFTCollator, tokenize_sft
from fedhf.runtime.hardware import cpu_has_bf16_matmul
from fedhf.runtime.labelled_logits import at_labelled_positions

from tests.helpers import config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
DTYPE = torch.bfloat16 if cpu_has_bf16_matmul() else torch.float32  # the base's; LoRA stays fp32


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma_dir)


def gemma_lora(gemma_dir, dtype=DTYPE, seed: int = 0):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=dtype)
    torch.manual_seed(seed)
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                            task_type=TaskType.CAUSAL_LM))


@pytest.fixture(scope="module")
def tweets(gemma_tokenizer):
    splits = load_tweet_instructions()
    return {"train": tokenize_sft(subsample(splits["train"], 96), gemma_tokenizer, max_length=64),
            "test": tokenize_sft(subsample(splits["test"], 16), gemma_tokenizer, max_length=64)}


FEDERATION = dict(num_clients=4, clients_per_round=2, num_rounds=2, local_steps=3, per_device_train_batch_size=8,
                  per_device_eval_batch_size=16, partition_report=False)


def test_lora_with_a_second_order_algorithm_lowers_eval_loss(gemma_dir, gemma_tokenizer, tweets, tmp_path):
    args = config(tmp_path, algorithm="fedpac_muon", learning_rate=0.02, eval_on_start=True, eval_every_rounds=2,
                  **FEDERATION)
    trainer = FederatedTrainer(model=gemma_lora(gemma_dir), args=args, train_dataset=tweets["train"],
                               eval_dataset=tweets["test"], data_collator=SFTCollator(gemma_tokenizer))
    assert trainer.labelled_logits  # Gemma3ForCausalLM: the head only at the answer tokens
    trainer.train()
    losses = [h["eval_loss"] for h in trainer.federated_history if "eval_loss" in h]
    assert len(losses) == 2 and losses[-1] < losses[0] - 1.0, losses


def test_batched_clients_equal_one_at_a_time(gemma_dir, gemma_tokenizer, tweets, tmp_path):
    """Two clients stacked on the one resident base (their rows concatenated, padded to the longest) give the
    adapter two sequential clients give; fp32 so the comparison is to float rounding."""
    adapters = []
    for batched in (1, 2):
        args = config(tmp_path / str(batched), algorithm="fedavg", learning_rate=0.05, batched_clients=batched,
                      **{**FEDERATION, "num_rounds": 1, "local_steps": 2, "per_device_train_batch_size": 4})
        trainer = FederatedTrainer(model=gemma_lora(gemma_dir, torch.float32), args=args,
                                   train_dataset=tweets["train"], data_collator=SFTCollator(gemma_tokenizer))
        start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}  # seed 0's
        trainer.train()
        adapters.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad})
    moved = max((adapters[0][n] - start[n]).abs().max() for n in start)
    assert moved > 1e-4  # the clients trained
    for name, value in adapters[0].items():
        torch.testing.assert_close(adapters[1][name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_chat_messages_under_trl_learn_the_assistant_turns_only(gemma_dir, gemma_tokenizer, tmp_path):
    """FederatedSFTTrainer (trl) on chat ``messages`` rendered by the Gemma turn-format template fedhf supplies
    (the base GGUF has none), ``assistant_only_loss``: the labels are exactly the answer and its <end_of_turn>,
    and a round lowers the eval loss. Then the same tweets as prompt/completion."""
    import datasets

    from fedhf.data.bundled_gemma import GEMMA_CHAT_TEMPLATE
    from fedhf.data.demo import TWEET_LABELS
    from fedhf.trainer.sft import FederatedSFTConfig, FederatedSFTTrainer

    tokenizer = type(gemma_tokenizer).from_pretrained(gemma_dir)
    tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    rows = subsample(load_tweet_instructions()["train"], 56)
    chats = datasets.Dataset.from_dict({
        "messages": [[{"role": "user", "content": p}, {"role": "assistant", "content": TWEET_LABELS[y]}]
                     for p, y in zip(rows["prompt"], rows["label"])], "label": rows["label"]})
    for data, extra in ((chats, {"assistant_only_loss": True}), (rows, {"completion_only_loss": True})):
        split = data.train_test_split(test_size=8, seed=0)
        args = FederatedSFTConfig(output_dir=str(tmp_path / next(iter(extra))), report_to="none", disable_tqdm=True,
                                  logging_strategy="no", save_strategy="no", seed=0, use_cpu=True, bf16=False,
                                  gradient_checkpointing=False, max_length=64, algorithm="fedavg",
                                  learning_rate=0.05, eval_on_start=True, eval_every_rounds=1,
                                  **{**FEDERATION, "num_rounds": 1, "local_steps": 3}, **extra)
        sft = FederatedSFTTrainer(model=gemma_lora(gemma_dir), args=args, train_dataset=split["train"],
                                  eval_dataset=split["test"], processing_class=tokenizer)
        batch = next(iter(sft.get_eval_dataloader()))
        first = batch["labels"][0][batch["labels"][0] != -100].tolist()
        answer = TWEET_LABELS[split["test"][0]["label"]]
        closing = "<end_of_turn>" if "messages" in data.column_names else tokenizer.eos_token
        assert tokenizer.decode(first) == (answer if "messages" in data.column_names else " " + answer) + closing
        sft.train()
        losses = [h["eval_loss"] for h in sft.federated_history if "eval_loss" in h]
        assert losses[-1] < losses[0] - 0.5, losses


def test_qlora_trains_and_the_saved_adapter_reloads(gemma_dir, gemma_tokenizer, tweets, tmp_path):
    """bitsandbytes re-quantises the de-quantised Gemma to NF4; the federated adapter trains on it, and the saved
    adapter on a freshly quantised base gives the trainer's eval loss."""
    import warnings

    from peft import PeftModel, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

    from fedhf.runtime.quantization import keep_trainable_4bit_layout

    def base():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoModelForCausalLM.from_pretrained(gemma_dir, device_map="cpu", quantization_config=(
                BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)))

    model = prepare_model_for_kbit_training(base(), use_gradient_checkpointing=False)
    torch.manual_seed(0)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                             task_type=TaskType.CAUSAL_LM))
    args = config(tmp_path, algorithm="fedavg", learning_rate=0.05, eval_on_start=True, eval_every_rounds=1,
                  **{**FEDERATION, "num_rounds": 1, "local_steps": 3})
    trainer = FederatedTrainer(model=model, args=args, train_dataset=tweets["train"], eval_dataset=tweets["test"],
                               data_collator=SFTCollator(gemma_tokenizer))
    trainer.train()
    losses = [h["eval_loss"] for h in trainer.federated_history if "eval_loss" in h]
    assert losses[-1] < losses[0] - 0.5, losses
    trainer.save_model(str(tmp_path / "adapter"))
    fresh = base()
    keep_trainable_4bit_layout(fresh)  # the kernel the trainer used, not bitsandbytes' CPU inference one
    reloaded = PeftModel.from_pretrained(fresh, str(tmp_path / "adapter"))
    plain = Trainer(model=reloaded, args=TrainingArguments(str(tmp_path / "eval"), report_to="none", use_cpu=True,
                                                           per_device_eval_batch_size=16),
                    eval_dataset=tweets["test"], data_collator=SFTCollator(gemma_tokenizer))
    assert plain.evaluate()["eval_loss"] == pytest.approx(losses[-1], abs=1e-4)


def test_the_memory_plan_shows_the_logits_and_bounds_what_autograd_keeps(gemma_dir, gemma_tokenizer, tweets,
                                                                        tmp_path):
    """The 262 K vocabulary makes the logits the largest activation of a step that projects every position; the
    plan's activations plus its kept logits bound what autograd keeps for the backward of the plan's micro-batch
    (the longest row, padded), within 35 %, with the head at every position and at the labelled ones only."""
    from fedhf.runtime.head_memory import LOSS_LOGITS
    from tests.trainer.runners.test_memory_plan import _saved_for_backward

    rows = tweets["train"].select(range(8))
    longest = max(len(r) for r in rows["input_ids"])
    batch = SFTCollator(gemma_tokenizer)([rows[i] for i in range(8)])
    batch = {k: torch.nn.functional.pad(v, (0, longest - v.shape[1]), value=-100 if k == "labels" else 0)
             for k, v in batch.items()}
    for labelled in (False, True):
        args = config(tmp_path / str(labelled), algorithm="fedavg", learning_rate=0.05, logits_at_labels_only=labelled,
                      **{**FEDERATION, "num_rounds": 1, "local_steps": 1, "num_clients": 1, "clients_per_round": 1})
        trainer = FederatedTrainer(model=gemma_lora(gemma_dir), args=args, train_dataset=rows,
                                   data_collator=SFTCollator(gemma_tokenizer))
        trainer.train()
        plan = trainer.memory_plan
        kept_logits = plan.logits_bytes / LOSS_LOGITS  # of the row: the fp32 copy kept, and 2 around the loss
        if not labelled:
            assert plan.logits_bytes > plan.activation_bytes and "logits" in str(plan)
        measured = _saved_for_backward(trainer.model, at_labelled_positions(batch) if labelled else batch)
        planned = plan.activation_bytes + kept_logits
        assert measured <= planned <= 1.35 * measured, (labelled, measured, planned, str(plan))
