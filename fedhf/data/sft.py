"""Supervised fine-tuning (SFT) data for causal LMs: the three formats LLM users have, tokenised so that the loss
falls only on what the model should learn to write.

* ``prompt`` + ``completion`` columns: labels on the completion tokens (and the EOS after it), -100 on the prompt.
* ``messages`` (a list of ``{"role", "content"}``): rendered with the tokenizer's chat template; labels on the
  assistant turns only (as trl's ``assistant_only_loss``), -100 on system/user turns and template scaffolding.
* ``text``: labels on every token (plain language modelling).

The format is picked by column, in that order. Every other column (e.g. the category the Dirichlet split uses) is
kept, so ``FederatedConfig(partition_column=...)`` works on the result. Packing (Krell et al. 2021, "Efficient
sequence packing without cross-contamination", the naive "wrapped" variant trl also offers) concatenates the
examples and cuts blocks of ``max_length``; every token is kept exactly once.

Usage::

    train = tokenize_sft(dataset, tokenizer, max_length=256)
    FederatedTrainer(model, args, train_dataset=train, data_collator=SFTCollator(tokenizer))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import datasets
import torch

IGNORE_INDEX = -100  # the label value torch's cross_entropy (and every HF causal-LM loss) ignores
SFT_FORMATS = {"messages": ("messages",), "prompt_completion": ("prompt", "completion"), "text": ("text",)}
TOKEN_COLUMNS = ("input_ids", "attention_mask", "labels")


def sft_format(column_names: Sequence[str]) -> str:
    """The dataset's SFT format, from its columns; a clear error naming what is missing otherwise."""
    for name, needed in SFT_FORMATS.items():
        if all(c in column_names for c in needed):
            return name
    for have, missing in (("prompt", "completion"), ("completion", "prompt")):
        if have in column_names:
            raise ValueError(f"The dataset has a `{have}` column but no `{missing}` column; prompt/completion data "
                             "needs both.")
    raise ValueError(f"No SFT column found among {list(column_names)}: give `prompt` + `completion` columns, a chat "
                     "`messages` column (list of {'role', 'content'}), or a `text` column.")


def _special(tokenizer, bos: bool, eos: bool) -> tuple:
    head = [tokenizer.bos_token_id] if bos and tokenizer.bos_token_id is not None else []
    tail = [tokenizer.eos_token_id] if eos and tokenizer.eos_token_id is not None else []
    return head, tail


def _prompt_completion(tokenizer, prompt: str, completion: str, add_eos: bool) -> Dict[str, List[int]]:
    # Tokenised apart so the boundary is exact; the completion's text should start with its space (" positive").
    head, tail = _special(tokenizer, True, add_eos)
    p = head + tokenizer(prompt, add_special_tokens=False)["input_ids"]
    c = tokenizer(completion, add_special_tokens=False)["input_ids"] + tail
    return {"input_ids": p + c, "labels": [IGNORE_INDEX] * len(p) + c}


def _text(tokenizer, text: str, add_eos: bool) -> Dict[str, List[int]]:
    head, tail = _special(tokenizer, True, add_eos)
    ids = head + tokenizer(text, add_special_tokens=False)["input_ids"] + tail
    return {"input_ids": ids, "labels": list(ids)}


def assistant_spans(tokenizer, messages: List[dict]) -> tuple:
    """The rendered chat and the character spans of the assistant turns in it.

    A turn's span runs from the end of the conversation before it rendered with the generation prompt (so the
    template's "assistant header" is not learned) to the end of the conversation including it (so its end-of-turn
    marker is learned, as the model must emit it to stop)."""
    render = lambda msgs, gen=False: tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    full, spans = render(messages), []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = render(messages[:i], True), render(messages[:i + 1])
        if not (full.startswith(before) and full.startswith(through)):
            raise ValueError("The chat template does not render a conversation's prefix as a prefix of it; the "
                             "assistant tokens cannot be located. Use prompt/completion columns instead.")
        spans.append((len(before), len(through)))
    return full, spans


def _messages(tokenizer, messages: List[dict]) -> Dict[str, List[int]]:
    full, spans = assistant_spans(tokenizer, messages)
    # The template writes its own BOS/EOS text, so no special tokens are added here.
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    labels = [tok if any(s <= start and end <= e and end > start for s, e in spans) else IGNORE_INDEX
              for tok, (start, end) in zip(enc["input_ids"], enc["offset_mapping"])]
    return {"input_ids": list(enc["input_ids"]), "labels": labels}


def tokenize_sft(dataset: datasets.Dataset, tokenizer, max_length: Optional[int] = None, packing: bool = False,
                 add_eos: bool = True, group_column: Optional[str] = None) -> datasets.Dataset:
    """``input_ids``/``attention_mask``/``labels`` (-100 outside completion / assistant tokens), other columns kept.

    Args:
        max_length: truncate each example to this many tokens (prompt/completion pairs from the left, so the
            completion is kept; chats and text from the right); with ``packing``, the block length.
        packing: concatenate examples and cut ``max_length`` blocks. Blocks mix examples, so other columns cannot
            be kept, except ``group_column``: packing then runs within each of its values, which keeps the column
            (one value per block) for a label-skewed split.
        add_eos: end prompt/completion and text examples with the tokenizer's EOS (chat templates write their own).
    """
    fmt = sft_format(dataset.column_names)
    if fmt == "messages" and not tokenizer.chat_template:
        raise ValueError("The dataset has a `messages` column but the tokenizer has no chat template: set "
                         "`tokenizer.chat_template` (a Jinja string) or use prompt/completion columns.")
    if packing and not max_length:
        raise ValueError("`packing=True` needs `max_length` (the block length).")
    if group_column is not None and group_column not in dataset.column_names:
        raise ValueError(f"`group_column`={group_column!r} is not a column of the dataset ({dataset.column_names}).")

    def one(row):
        if fmt == "messages":
            out = _messages(tokenizer, row["messages"])
        elif fmt == "prompt_completion":
            out = _prompt_completion(tokenizer, row["prompt"], row["completion"], add_eos)
        else:
            out = _text(tokenizer, row["text"], add_eos)
        if max_length and not packing and len(out["input_ids"]) > max_length:
            # A prompt/completion pair loses the prompt's start, so the completion (what is learned) survives;
            # chats and text lose their end, as Trainer users expect.
            cut = slice(-max_length, None) if fmt == "prompt_completion" else slice(max_length)
            out = {k: v[cut] for k, v in out.items()}
        out["attention_mask"] = [1] * len(out["input_ids"])
        return out

    tokenized = dataset.map(one, remove_columns=list(SFT_FORMATS[fmt]), desc="tokenising SFT data")
    if not packing:
        return tokenized
    return pack(tokenized, max_length, group_column)


def _blocks(rows: datasets.Dataset, block: int) -> Dict[str, list]:
    ids = [t for seq in rows["input_ids"] for t in seq]
    labels = [t for seq in rows["labels"] for t in seq]
    cuts = range(0, len(ids), block)
    return {"input_ids": [ids[i:i + block] for i in cuts], "labels": [labels[i:i + block] for i in cuts],
            "attention_mask": [[1] * len(ids[i:i + block]) for i in cuts]}


def pack(tokenized: datasets.Dataset, block: int, group_column: Optional[str] = None) -> datasets.Dataset:
    """Concatenate and cut into ``block``-token rows (the last one shorter); within each ``group_column`` value."""
    if group_column is None:
        return datasets.Dataset.from_dict(_blocks(tokenized, block))
    values = tokenized[group_column]
    columns: Dict[str, list] = {"input_ids": [], "labels": [], "attention_mask": [], group_column: []}
    for value in sorted(set(values)):
        part = _blocks(tokenized.select([i for i, v in enumerate(values) if v == value]), block)
        for k, v in part.items():
            columns[k].extend(v)
        columns[group_column].extend([value] * len(part["input_ids"]))
    features = datasets.Features({**{k: tokenized.features[k] for k in TOKEN_COLUMNS},
                                  group_column: tokenized.features[group_column]})
    return datasets.Dataset.from_dict(columns, features=features)


@dataclass
class SFTCollator:
    """Pads each batch to its longest row (dynamic padding): ``input_ids`` with the pad token (EOS if the tokenizer
    has none), ``attention_mask`` with 0 and ``labels`` with -100, on the right. Only these three columns go to the
    model; the others (the split's category) stay in the dataset."""

    tokenizer: object
    pad_to_multiple_of: Optional[int] = None

    def __post_init__(self) -> None:
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("The tokenizer has neither a pad nor an EOS token: set `tokenizer.pad_token`.")

    def __call__(self, rows: List[dict]) -> Dict[str, torch.Tensor]:
        for column in TOKEN_COLUMNS:
            if column not in rows[0]:
                raise ValueError(f"SFTCollator needs `{column}` in every row: tokenise with "
                                 "fedhf.data.sft.tokenize_sft.")
        length = max(len(r["input_ids"]) for r in rows)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        fill = {"input_ids": self.pad_id, "attention_mask": 0, "labels": IGNORE_INDEX}
        return {k: torch.tensor([list(r[k]) + [v] * (length - len(r[k])) for r in rows], dtype=torch.long)
                for k, v in fill.items()}
