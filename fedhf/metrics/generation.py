"""LLM evaluation each evaluated round: perplexity and a generation-based answer accuracy.

``perplexity = exp(eval_loss)`` with eval_loss the per-token mean cross-entropy on the labelled (completion)
tokens. The generation metric asks the model what a person would: generate greedily a few tokens after each
held-out prompt, parse the first word, compare it with the reference answer (the "first-word exact match" used
for classification-as-generation, e.g. Brown et al. 2020, "Language Models are Few-Shot Learners", sec. 3.7).

Two rules turn a generated answer into a label (``answer_rule``):

* ``"first_word"`` (default): the first word, as above; an answer whose first word is none of the closed set's is
  *unparseable* (``eval_generation_unparseable_rate``, reported when the candidate answers are given).
* ``"flowertune"``: FlowerTune's finance (sentiment) rule, so a number can be read beside its leaderboard. Flower's
  finance evaluation maps both the generated text and the reference to "positive" if it contains "positive" or
  "Positive" anywhere, else to "negative" if it contains "negative" or "Negative", else to "neutral", and counts
  matches. Nothing is unparseable under it (an answer without either word is "neutral"), so an answer that says
  nothing scores as neutral. Differences left: FlowerTune generates up to 512 tokens of the full prompt and reads the
  text after "Answer: "; here the continuation is ``max_new_tokens`` long after the task's own prompt.

Given the closed set of answers (``choices``), the callback also scores them by log-likelihood
(:mod:`fedhf.metrics.loglik`): ``eval_loglik_accuracy`` and ``eval_loglik_answer_logprob``, the parser-free number.

``GenerationEvalCallback`` adds these to the metrics of every ``evaluate()`` (so to the federated history, its
plot and the model card); ``first_word_accuracy`` and ``flowertune_accuracy`` are the pure scorers.
"""

from __future__ import annotations

import math
import re
from typing import List, Optional, Sequence, Union

import torch
from transformers import TrainerCallback

from ..runtime.contiguous_head import feed_head_contiguously


def first_word(text: str) -> str:
    """The first word, lower-cased, without punctuation ("" if none): a run of Unicode word characters, so an
    answer in any script ("正面", "хорошо", "négatif") is a word, not the empty string."""
    match = re.search(r"\w+", text.lower())
    return match.group(0) if match else ""


def first_word_accuracy(predictions: Sequence[str], answers: Sequence[str]) -> float:
    """The share of predictions whose first word is the answer's; an answer without a word matches nothing."""
    if len(predictions) != len(answers) or not answers:
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answers; need as many, at least one.")
    return sum(bool(first_word(a)) and first_word(p) == first_word(a)
               for p, a in zip(predictions, answers)) / len(answers)


def flowertune_label(text: str) -> str:
    """FlowerTune's finance rule: "positive" if the text holds "positive"/"Positive", else "negative" if it holds
    "negative"/"Negative", else "neutral" (substrings, these two spellings only)."""
    if "positive" in text or "Positive" in text:
        return "positive"
    if "negative" in text or "Negative" in text:
        return "negative"
    return "neutral"


def flowertune_accuracy(predictions: Sequence[str], answers: Sequence[str]) -> float:
    """The share of predictions whose FlowerTune label is the answer's."""
    if len(predictions) != len(answers) or not answers:
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answers; need as many, at least one.")
    return sum(flowertune_label(p) == flowertune_label(a) for p, a in zip(predictions, answers)) / len(answers)


def unparseable_rate(predictions: Sequence[str], choices: Sequence[str]) -> float:
    """The share of predictions whose first word is none of the choices' first words."""
    if not predictions:
        raise ValueError("unparseable_rate needs at least one prediction.")
    known = {first_word(c) for c in choices}
    return sum(first_word(p) not in known for p in predictions) / len(predictions)


ANSWER_RULES = {"first_word": first_word_accuracy, "flowertune": flowertune_accuracy}
Prompt = Union[str, List[dict]]  # text, or a chat (a list of {"role", "content"}) to answer


def prompt_ids(tokenizer, prompt: Prompt) -> List[int]:
    """A prompt's tokens as tokenize_sft writes them: text with BOS (if the tokenizer has one) and no other special
    token; a chat rendered with the tokenizer's chat template and its generation prompt (the assistant header
    the model learned to answer after), the template writing its own special tokens."""
    if isinstance(prompt, str):
        return _bos(tokenizer) + tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if not tokenizer.chat_template:
        raise ValueError("A chat prompt (a list of messages) needs the tokenizer's chat template: set "
                         "`tokenizer.chat_template` or give the prompts as text.")
    text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _bos(tokenizer) -> List[int]:
    return [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []


def cut_prompt(ids: List[int], max_tokens: Optional[int], bos: List[int]) -> List[int]:
    """At most ``max_tokens``: a leading BOS kept, then the prompt's end (next to where the answer starts)."""
    if max_tokens is None or len(ids) <= max_tokens:
        return ids
    head = ids[:len(bos)] if bos and ids[:len(bos)] == bos else []
    return head + ids[len(ids) - (max_tokens - len(head)):]


def _check_max_prompt_tokens(max_prompt_tokens: Optional[int]) -> None:
    if max_prompt_tokens is not None and max_prompt_tokens < 2:
        raise ValueError(f"`max_prompt_tokens` must be >= 2 (BOS and a prompt token) or None, got {max_prompt_tokens}.")


@torch.no_grad()
def generate_answers(model, tokenizer, prompts: Sequence[Prompt], max_new_tokens: int = 3, batch_size: int = 32,
                     max_prompt_tokens: Optional[int] = None) -> List[str]:
    """Greedy continuations of ``prompts`` (:func:`prompt_ids`), left-padded so every row generates from its last
    token. ``max_prompt_tokens`` (default: no cut) keeps a long prompt's BOS and its end."""
    _check_max_prompt_tokens(max_prompt_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    feed_head_contiguously(model)
    was_training, outputs = model.training, []
    model.eval()
    for start in range(0, len(prompts), batch_size):
        rows = [cut_prompt(prompt_ids(tokenizer, p), max_prompt_tokens, _bos(tokenizer))
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
    any are given, read with ``answer_rule`` ("first_word" or "flowertune", see the module docstring). A prompt is
    text or a chat (a list of messages, answered after the chat template's generation prompt); ``max_prompt_tokens``
    (default: none, the whole prompt as the model will see it in use) bounds a long prompt, keeping its BOS and its
    end.

    ``choices``: the closed set of answers as the completions are written (" negative", " neutral", " positive"),
    each answer among them. Given it, every evaluation also reports ``eval_generation_unparseable_rate`` (first-word
    rule) and the log-likelihood scores ``eval_loglik_accuracy`` and ``eval_loglik_answer_logprob``
    (:mod:`fedhf.metrics.loglik`)."""

    def __init__(self, tokenizer, prompts: Sequence[Prompt] = (), answers: Sequence[str] = (),
                 max_new_tokens: int = 3, max_prompt_tokens: Optional[int] = None, choices: Sequence[str] = (),
                 answer_rule: str = "first_word") -> None:
        if len(prompts) != len(answers):
            raise ValueError("GenerationEvalCallback needs as many answers as prompts (none: perplexity only).")
        if answer_rule not in ANSWER_RULES:
            raise ValueError(f"`answer_rule` must be one of {sorted(ANSWER_RULES)}, got {answer_rule!r}.")
        _check_max_prompt_tokens(max_prompt_tokens)  # before training, not at the first evaluation
        for prompt in prompts:
            prompt_ids(tokenizer, prompt)  # a chat without a chat template is refused here, before training
        self.choices = list(choices)
        if self.choices:
            missing = sorted({a for a in answers if a not in self.choices})
            if missing:
                raise ValueError(f"Answers {missing[:3]} are not among `choices` {self.choices}: give the answers as "
                                 "the choices write them (with their leading space).")
        self.tokenizer, self.prompts, self.answers = tokenizer, list(prompts), list(answers)
        self.max_new_tokens, self.max_prompt_tokens = max_new_tokens, max_prompt_tokens
        self.answer_rule = answer_rule

    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        # Trainer.evaluate returns this same dict after the callbacks ran, so the additions reach the history.
        if "eval_loss" in metrics:
            metrics["eval_perplexity"] = math.exp(min(metrics["eval_loss"], 50.0))
        if not self.prompts:
            return
        predictions = generate_answers(model, self.tokenizer, self.prompts, self.max_new_tokens,
                                       args.per_device_eval_batch_size, self.max_prompt_tokens)
        metrics["eval_generation_accuracy"] = ANSWER_RULES[self.answer_rule](predictions, self.answers)
        if self.choices:
            from .loglik import score_candidates

            metrics["eval_generation_unparseable_rate"] = unparseable_rate(predictions, self.choices)
            scores = score_candidates(model, self.tokenizer, self.prompts, self.choices,
                                      [self.choices.index(a) for a in self.answers])
            metrics["eval_loglik_accuracy"] = scores.accuracy
            metrics["eval_loglik_answer_logprob"] = scores.answer_logprob
