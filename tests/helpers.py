"""Builders for the small real models the tests train."""

from __future__ import annotations

from typing import Optional

import torch
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding, ResNetConfig, \
    ResNetForImageClassification

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.metrics import accuracy_metrics


def lora_minilm(path: str, dropout: bool = True, seed: int = 0, layers: Optional[int] = None):
    """MiniLM (6 layers) with LoRA on query/value and its new 3-class head; ``layers`` keeps only the first
    pretrained layers (a third of the compute at 1, for tests that check mechanics rather than learning)."""
    torch.manual_seed(seed)
    extra = {} if dropout else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    if layers is not None:
        extra["num_hidden_layers"] = layers
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3, **extra)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1 if dropout else 0.0, target_modules=["query", "value"],
                      task_type=TaskType.SEQ_CLS)
    return get_peft_model(model, lora)


def tiny_resnet(seed: int = 0):
    torch.manual_seed(seed)
    config = ResNetConfig(num_channels=1, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                          num_labels=10)
    return ResNetForImageClassification(config)


def config(tmp_path, **overrides) -> FederatedConfig:
    base = dict(output_dir=str(tmp_path / "run"), report_to="none", disable_tqdm=True, logging_strategy="no",
                save_strategy="no", seed=0, num_clients=4, clients_per_round=4, num_rounds=2, local_steps=2,
                per_device_train_batch_size=16, per_device_eval_batch_size=128, use_cpu=True, eval_every_rounds=0)
    base.update(overrides)
    return FederatedConfig(**base)


def tweet_trainer(model, tweets, tokenizer, args, evaluate: bool = True, **kwargs) -> FederatedTrainer:
    eval_dataset = tweets["test"] if evaluate else None
    return FederatedTrainer(model=model, args=args, train_dataset=tweets["train"], eval_dataset=eval_dataset,
                            data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy_metrics,
                            **kwargs)


def digit_trainer(model, digits, args, evaluate: bool = True, **kwargs) -> FederatedTrainer:
    eval_dataset = digits["test"] if evaluate else None
    return FederatedTrainer(model=model, args=args, train_dataset=digits["train"], eval_dataset=eval_dataset,
                            compute_metrics=accuracy_metrics, **kwargs)


def trainable_state(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def frozen_state(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def tiny_llama_lora(vocab_size: int, seed: int = 0):
    from fedhf.data.demo import tiny_llama

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      task_type=TaskType.CAUSAL_LM)
    return get_peft_model(tiny_llama(vocab_size, seed=seed), lora)


def tweet_sft(tokenizer, n_train: int = 200, n_test: int = 50, max_length: int = 48):
    """Real tweets as tokenised prompt/completion pairs (label column kept)."""
    from fedhf.data.demo import load_tweet_instructions, subsample
    from fedhf.data.sft import tokenize_sft

    splits = load_tweet_instructions()
    return {"train": tokenize_sft(subsample(splits["train"], n_train), tokenizer, max_length=max_length),
            "test": tokenize_sft(subsample(splits["test"], n_test), tokenizer, max_length=max_length)}


# ---------------------------------------------------------------------------------------------- causal LM (QLoRA, TRL)
SENTIMENT_PROMPT = "Tweet: {text}\nSentiment:"


def tiny_llama_dir(path: str, tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4) -> str:
    """A small LlamaForCausalLM built from a config over the MiniLM tokenizer's vocabulary, saved to ``path`` so
    that it loads like a Hub checkpoint (which is how a quantised base is obtained)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def tokenize_prompt_completion(tokenizer, prompt: str, completion: str, eos: str = "[SEP]") -> dict:
    """trl's prompt-completion tokenisation done by hand: the loss is on the tokens after the longest common prefix
    of tokenize(prompt) and tokenize(prompt + completion + eos) (trl.SFTTrainer._prepare_dataset)."""
    prompt_ids = tokenizer(text=prompt)["input_ids"]
    ids = tokenizer(text=prompt + completion + eos)["input_ids"]
    start = next((i for i, (a, b) in enumerate(zip(prompt_ids, ids)) if a != b), min(len(prompt_ids), len(ids)))
    return {"input_ids": ids, "labels": [-100] * start + ids[start:]}


def sentiment_pairs(tweets, n_train: int, n_eval: int, max_chars: int = 120):
    """Bundled tweets as prompt/completion pairs ("Tweet: ...\\nSentiment:" -> " positive"), with the ``label``
    column kept for the split."""
    from fedhf.data.demo import TWEET_LABELS, subsample

    def pairs(ds, n):
        ds = subsample(ds, n, seed=0)
        return ds.map(lambda row: {"prompt": SENTIMENT_PROMPT.format(text=row["text"][:max_chars]),
                                   "completion": " " + TWEET_LABELS[row["label"]]}, remove_columns=["text"])

    return {"train": pairs(tweets["train"], n_train), "test": pairs(tweets["test"], n_eval)}


def tokenized_pairs(pairs, tokenizer):
    return {split: ds.map(lambda row: tokenize_prompt_completion(tokenizer, row["prompt"], row["completion"]),
                          remove_columns=["prompt", "completion"]) for split, ds in pairs.items()}


def causal_lm_collator(pad_token_id: int):
    """Right-pads input_ids (pad id), labels (-100) and the attention mask; other columns (the split's ``label``)
    are not model inputs."""

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)

        def pad(key, value):
            return torch.tensor([r[key] + [value] * (width - len(r[key])) for r in rows])

        mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows])
        return {"input_ids": pad("input_ids", pad_token_id), "attention_mask": mask, "labels": pad("labels", -100)}

    return collate


# ------------------------------------------------------------------------------ synthetic answer rows (no tokenizer)
class IdsOnly:
    """What ``SFTCollator`` reads of a tokenizer, for rows that are token ids already."""

    pad_token_id, eos_token_id = 0, 1


def answer_rows(n: int, seed: int = 0, length: int = 12, answer: int = 3, vocab: int = 100):
    """``n`` causal-LM rows of random ids whose last ``answer`` tokens (the only labelled ones) repeat a function of
    the first token, so a tiny model (``tiny_llama(vocab)``) can learn them in a few steps."""
    import datasets

    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(2, vocab, (length,), generator=g).tolist()
        ids[-answer:] = [ids[0] % 10 + 2] * answer
        rows.append({"input_ids": ids, "attention_mask": [1] * length,
                     "labels": [-100] * (length - answer) + ids[-answer:]})
    return datasets.Dataset.from_list(rows)


WALL_CLOCK_SUFFIXES = ("_runtime", "_per_second", "_preparation_time", "_seconds")


def without_timings(history: list) -> list:
    """A history without its wall-clock entries (runtimes, throughputs, preparation and compression seconds), which
    no two runs share; everything else must match bit for bit between two runs of the same seed."""
    return [{k: v for k, v in entry.items() if not k.endswith(WALL_CLOCK_SUFFIXES)} for entry in history]


def step_alike(optimizer, reference, ours, theirs, steps: int) -> None:
    """``steps`` steps of two optimizers over twin parameter lists, each step's random gradients the same on both."""
    for _ in range(steps):
        for p, q in zip(ours, theirs):
            p.grad = torch.randn(p.shape)
            q.grad = p.grad.clone()
        optimizer.step()
        reference.step()
