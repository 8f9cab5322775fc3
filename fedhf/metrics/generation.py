"""LLM evaluation each evaluated round: perplexity and a generation-based answer accuracy.

``perplexity = exp(eval_loss)`` with eval_loss the per-token mean cross-entropy on the labelled (completion)
tokens. The generation metric asks the model what a person would: generate greedily a few tokens after each
held-out prompt, parse the first word, compare it with the reference answer (the "first-word exact match" used
for classification-as-generation, e.g. Brown et al. 2020, "Language Models are Few-Shot Learners", sec. 3.7).

``GenerationEvalCallback`` adds both to the metrics of every ``evaluate()`` (so to the federated history and its
plot); ``first_word_accuracy`` is the pure scorer, usable anywhere.
"""

from __future__ import annotations

import math
import re
from typing import List, Sequence

import torch
from transformers import TrainerCallback


def first_word(text: str) -> str:
    """The first word, lower-cased, without punctuation ("" if none)."""
    match = re.search(r"[a-z0-9]+", text.lower())
    return match.group(0) if match else ""


def first_word_accuracy(predictions: Sequence[str], answers: Sequence[str]) -> float:
    if len(predictions) != len(answers) or not answers:
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answers; need as many, at least one.")
    return sum(first_word(p) == first_word(a) for p, a in zip(predictions, answers)) / len(answers)


@torch.no_grad()
def generate_answers(model, tokenizer, prompts: Sequence[str], max_new_tokens: int = 3, batch_size: int = 32,
                     max_prompt_tokens: int = 64) -> List[str]:
    """Greedy continuations of ``prompts`` (tokenised as tokenize_sft does: BOS if any, no other special tokens;
    long prompts keep their end, like its truncation), left-padded so every row generates from its last token."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    device = next(model.parameters()).device
    was_training, outputs = model.training, []
    model.eval()
    for start in range(0, len(prompts), batch_size):
        rows = [(bos + tokenizer(p, add_special_tokens=False)["input_ids"])[-max_prompt_tokens:]
                for p in prompts[start:start + batch_size]]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad)
        outputs += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    model.train(was_training)
    return outputs


class GenerationEvalCallback(TrainerCallback):
    """On every evaluation: ``eval_perplexity``, and ``eval_generation_accuracy`` over (prompt, answer) pairs if
    any are given."""

    def __init__(self, tokenizer, prompts: Sequence[str] = (), answers: Sequence[str] = (),
                 max_new_tokens: int = 3) -> None:
        if len(prompts) != len(answers):
            raise ValueError("GenerationEvalCallback needs as many answers as prompts (none: perplexity only).")
        self.tokenizer, self.prompts, self.answers = tokenizer, list(prompts), list(answers)
        self.max_new_tokens = max_new_tokens

    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        # Trainer.evaluate returns this same dict after the callbacks ran, so the additions reach the history.
        if "eval_loss" in metrics:
            metrics["eval_perplexity"] = math.exp(min(metrics["eval_loss"], 50.0))
        if not self.prompts:
            return
        predictions = generate_answers(model, self.tokenizer, self.prompts, self.max_new_tokens,
                                       args.per_device_eval_batch_size)
        metrics["eval_generation_accuracy"] = first_word_accuracy(predictions, self.answers)
