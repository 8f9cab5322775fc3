"""Log-likelihood scoring of closed-set answers: which candidate answer does the model find most likely?

For a task whose answers are a fixed set (the tweets' " negative" / " neutral" / " positive"), a generated answer
must be parsed and can fail to parse; the model's own probabilities need no parser. For each held-out prompt and
each candidate c (tokens c_1..c_n, tokenised apart from the prompt as tokenize_sft tokenises a completion):

    log p(c | prompt) = sum_j log softmax(logits at the position before c_j)[c_j],

the prediction is the argmax over the candidates (the first on a tie), and the reported numbers are the accuracy
of that prediction and the mean log-probability of the right answer. This is the multiple-choice ``acc`` of
EleutherAI's lm-evaluation-harness (unnormalised log-likelihood, argmax); benchmarks/loglik_scoring.py checks the
two agree on the same rows.

A row's candidates go through the model together: one forward of (candidates, prompt + longest candidate) tokens,
right-padded, with the head projecting only the candidates' positions where the model allows it
(fedhf/runtime/labelled_logits.py), so a 262k-token vocabulary is projected at a few positions per row. Where every
candidate is one token (the tweets' three answers are, for Gemma), they all follow the same position, so one
sequence per row gives all of them: the same numbers from a third of the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import torch

from ..runtime.labelled_logits import IGNORE, labelled_positions, predicts_at_positions
from .generation import Prompt, prompt_ids


@dataclass(frozen=True)
class LoglikScores:
    """Per row, every candidate's log-probability (rows, candidates), float64; and the metrics over the rows."""

    logprobs: torch.Tensor
    answers: torch.Tensor  # the right candidate's index per row

    @property
    def predictions(self) -> torch.Tensor:
        return self.logprobs.argmax(dim=1)  # torch's argmax returns the first maximal index

    @property
    def accuracy(self) -> float:
        return float((self.predictions == self.answers).double().mean())

    @property
    def answer_logprob(self) -> float:
        """The mean over rows of the right answer's log-probability."""
        return float(self.logprobs.gather(1, self.answers[:, None]).mean())


def candidate_rows(tokenizer, prompt: Prompt, candidates: Sequence[str]) -> List[tuple]:
    """(input_ids, labels) of the prompt followed by each candidate; labels -100 on the prompt."""
    head = prompt_ids(tokenizer, prompt)
    if not head:  # a candidate's first token would have nothing before it to be predicted from
        raise ValueError(f"The prompt {prompt!r} has no tokens (and the tokenizer no BOS): nothing predicts a "
                         "candidate's first token.")
    rows = []
    for text in candidates:
        answer = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not answer:
            raise ValueError(f"The candidate answer {text!r} has no tokens.")
        rows.append((head + answer, [IGNORE] * len(head) + answer))
    return rows


def _batch(rows: List[tuple], pad: int) -> dict:
    width = max(len(ids) for ids, _ in rows)
    return {"input_ids": torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows]),
            "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows]),
            "labels": torch.tensor([labels + [IGNORE] * (width - len(labels)) for _, labels in rows])}


@torch.no_grad()
def labelled_logprobs(model, batch: dict):
    """The log-softmax over the vocabulary (float32) at the position before each labelled token, (batch, K, vocab),
    and the labelled tokens (batch, K; ``IGNORE`` where a row has fewer than K)."""
    positions, targets = labelled_positions(batch["labels"])
    device = next(model.parameters()).device
    inputs = {"input_ids": batch["input_ids"].to(device), "attention_mask": batch["attention_mask"].to(device)}
    if predicts_at_positions(model):
        logits = model(**inputs, logits_to_keep=positions.to(device)).logits
    else:
        logits = model(**inputs).logits.take_along_dim(positions.to(device)[..., None], dim=1)
    return torch.log_softmax(logits.float(), dim=-1), targets.to(device)


def sequence_logprobs(model, batch: dict) -> torch.Tensor:
    """Per sequence, the summed log-probability (float64) of its labelled tokens given what precedes them."""
    logprobs, targets = labelled_logprobs(model, batch)
    picked = logprobs.gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1)
    return torch.where(targets.ne(IGNORE), picked, 0.0).double().sum(1).cpu()


def next_token_logprobs(model, batch: dict, tokens: Sequence[int]) -> torch.Tensor:
    """Per row of ``batch`` (each labelled at exactly one position), the log-probability (float64) of each of
    ``tokens`` there: (rows, len(tokens))."""
    logprobs, _ = labelled_logprobs(model, batch)
    return logprobs[:, 0, list(tokens)].double().cpu()


def score_candidates(model, tokenizer, prompts: Sequence[Prompt], candidates: Sequence[str],
                     answers: Sequence[int], rows_per_forward: int = 8) -> LoglikScores:
    """Every candidate's log-probability after every prompt (``rows_per_forward`` prompts per forward, each with
    all its candidates), and the right candidate's index per prompt."""
    if len(prompts) != len(answers) or not prompts:
        raise ValueError(f"{len(prompts)} prompts for {len(answers)} answers; need as many, at least one.")
    if len(set(candidates)) != len(candidates) or len(candidates) < 2:
        raise ValueError(f"Log-likelihood scoring needs at least two distinct candidate answers, got {candidates!r}.")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    tokens = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in candidates]
    one_token_each = all(len(t) == 1 for t in tokens)
    was_training = model.training
    model.eval()
    scores = []
    for start in range(0, len(prompts), rows_per_forward):
        chunk = prompts[start:start + rows_per_forward]
        if one_token_each:  # every candidate follows the prompt's last token: one sequence per prompt
            rows = [candidate_rows(tokenizer, p, candidates[:1])[0] for p in chunk]
            scores.append(next_token_logprobs(model, _batch(rows, pad), [t[0] for t in tokens]))
        else:
            rows = [row for p in chunk for row in candidate_rows(tokenizer, p, candidates)]
            scores.append(sequence_logprobs(model, _batch(rows, pad)).view(-1, len(candidates)))
    model.train(was_training)
    return LoglikScores(torch.cat(scores), torch.tensor(list(answers), dtype=torch.long))
