"""Supervised fine-tuning (SFT) data for causal LMs: the three formats LLM users have, tokenised so that the loss
falls only on what the model should learn to write.

* ``prompt`` + ``completion`` columns: labels on the completion tokens (and the EOS after it), -100 on the prompt.
* ``messages`` (a list of ``{"role", "content"}``): rendered with the tokenizer's chat template; labels on the
  assistant turns only (as trl's ``assistant_only_loss``), -100 on system/user turns and template scaffolding.
* ``text``: labels on every token (plain language modelling).

The format is picked by column, in that order. Every other column (e.g. the category the Dirichlet split uses) is
kept, so ``FederatedConfig(partition_column=...)`` works on the result. Rows without a single label token (a
chat whose system prompt fills ``max_length`` so that truncation cuts every assistant token, a chat without an
assistant turn) teach nothing and are dropped with a warning that counts them, as trl does.

Packing concatenates the examples and cuts blocks of ``max_length`` (the "wrapped" strategy trl also offers, so an
example may be split over two blocks), and keeps the examples apart inside a block as Krell et al. 2021
("Efficient sequence packing without cross-contamination", arXiv:2107.02027) do: each block carries
per-document ``position_ids`` restarting at 0 at every document (and at the block's start) and no
``attention_mask``, the padding-free format from which transformers builds a block-diagonal causal mask (sdpa and
eager attention: a token attends only to its own document's earlier tokens) or the flash-attention varlen
boundaries; the first token of each document is not a label, since it would be predicted from the previous
document. A packed batch's logits and loss on a document equal that document's alone (tests/data/test_sft.py
checks this on a Llama). ``SFTCollator`` passes them on, with ``use_cache=False``, without which transformers'
models build a cache and then ignore ``position_ids`` as document boundaries.

Usage::

    train = tokenize_sft(dataset, tokenizer, max_length=256)
    FederatedTrainer(model, args, train_dataset=train, data_collator=SFTCollator(tokenizer))
"""

from __future__ import annotations

import hashlib
import inspect
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import datasets
import torch

IGNORE_INDEX = -100  # the label value torch's cross_entropy (and every HF causal-LM loss) ignores
SFT_FORMATS = {"messages": ("messages",), "prompt_completion": ("prompt", "completion"), "text": ("text",)}
TOKEN_COLUMNS = ("input_ids", "attention_mask", "labels")
PACKED_COLUMNS = ("input_ids", "labels", "position_ids")  # padding-free: document boundaries in the positions


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
    marker is learned, as the model must emit it to stop), less the whitespace the template writes after that
    marker: trl's ``assistant_only_loss`` on the Gemma template labels the answer and ``<end_of_turn>``, not the
    newline after it."""
    render = lambda msgs, gen=False: tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    full, spans = render(messages), []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = render(messages[:i], True), render(messages[:i + 1])
        if not (full.startswith(before) and full.startswith(through)):
            raise ValueError("The chat template does not render a conversation's prefix as a prefix of it; the "
                             "assistant tokens cannot be located. Use prompt/completion columns instead.")
        spans.append((len(before), len(through.rstrip())))
    return full, spans


def _messages(tokenizer, messages: List[dict]) -> Dict[str, List[int]]:
    full, spans = assistant_spans(tokenizer, messages)
    # The template writes its own BOS/EOS text, so no special tokens are added here.
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    labels = [tok if any(s <= start and end <= e and end > start for s, e in spans) else IGNORE_INDEX
              for tok, (start, end) in zip(enc["input_ids"], enc["offset_mapping"])]
    return {"input_ids": list(enc["input_ids"]), "labels": labels}


def _cut_prompt(out: Dict[str, List[int]], max_length: int, head: int) -> Optional[Dict[str, List[int]]]:
    """A prompt/completion pair cut to ``max_length``: the ``head`` (BOS) and the whole completion kept, the prompt
    losing its start; None when the completion leaves no room for a single prompt token (it cannot be learned
    whole and conditioned on its prompt)."""
    labels = out["labels"]
    prompt_end = next((i for i, t in enumerate(labels) if t != IGNORE_INDEX), len(labels))
    room = max_length - head - (len(labels) - prompt_end)  # prompt tokens that fit
    if room < min(1, prompt_end - head):
        return None
    keep = slice(prompt_end - room, None)
    return {k: v[:head] + v[keep] for k, v in out.items()}


def drop_unlabelled(rows: datasets.Dataset, what: str) -> datasets.Dataset:
    """``rows`` without those that have no label token (their mean loss is 0/0), with a warning counting them."""
    kept = rows.filter(lambda r: any(t != IGNORE_INDEX for t in r["labels"]), desc="dropping rows without labels")
    if len(kept) < len(rows):
        warnings.warn(f"Dropped {len(rows) - len(kept)} of {len(rows)} {what} without a label token (nothing to "
                      "learn from them).", UserWarning, stacklevel=3)
    return kept


_ROW_FUNCTIONS = ("_special", "_prompt_completion", "_text", "assistant_spans", "_messages", "_cut_prompt")


def _code_key() -> str:
    """This module's tokenisation code as a hash: its source file, and each row function as bound now (a patched
    one too). datasets hashes a map's function unless given ``new_fingerprint``; without this, a dataset backed by
    files would get its rows cached by an older fedhf back after an upgrade changed how labels are placed."""
    def source(function) -> str:
        try:
            return inspect.getsource(function)
        except (OSError, TypeError):  # defined where no source file is (an interactive session)
            return repr(function.__code__.co_code) + repr(function.__code__.co_consts)
    parts = [Path(__file__).read_text(encoding="utf-8")] + [source(globals()[name]) for name in _ROW_FUNCTIONS]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def _fingerprint(dataset: datasets.Dataset, tokenizer, *settings) -> str:
    """The tokenised dataset's fingerprint (its cache key), from what decides it, the code included
    (:func:`_code_key`). datasets would otherwise hash the tokenizer by pickling it: Gemma's 262,144-token
    vocabulary took over a minute per call."""
    if tokenizer.is_fast:  # its whole definition, less the truncation/padding state that calling it changes
        backend = json.loads(tokenizer.backend_tokenizer.to_str())
        backend.pop("truncation", None), backend.pop("padding", None)
    else:
        backend = sorted(tokenizer.get_vocab().items())
    parts = (dataset._fingerprint, type(tokenizer).__name__, json.dumps(backend, sort_keys=True),
             tokenizer.chat_template, repr(sorted(tokenizer.special_tokens_map.items())), repr(settings),
             _code_key())
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).hexdigest()[:32]


def tokenize_sft(dataset: datasets.Dataset, tokenizer, max_length: Optional[int] = None, packing: bool = False,
                 add_eos: bool = True, group_column: Optional[str] = None) -> datasets.Dataset:
    """``input_ids``/``attention_mask``/``labels`` (-100 outside completion / assistant tokens), other columns kept.

    Args:
        max_length: truncate each example to this many tokens; with ``packing``, the block length. A
            prompt/completion pair keeps its BOS and its whole completion and loses the start of its prompt; a pair
            whose completion leaves no room for a prompt token is dropped (counted in a warning: cutting the
            completion would teach a truncated answer). Chats and text lose their end, as Trainer users expect.
        packing: concatenate examples into ``max_length`` blocks with per-document ``position_ids`` (no
            ``attention_mask``; see the module docstring). Blocks mix examples, so other columns cannot be kept,
            except ``group_column``: packing then runs within each of its values, which keeps the column (one
            value per block) for a label-skewed split.
        add_eos: end prompt/completion and text examples with the tokenizer's EOS (chat templates write their own).

    Rows without a single label token after truncation (and packed blocks without one) are dropped, with a
    warning that counts them.
    """
    fmt = sft_format(dataset.column_names)
    if fmt == "messages" and not tokenizer.chat_template:
        raise ValueError("The dataset has a `messages` column but the tokenizer has no chat template: set "
                         "`tokenizer.chat_template` (a Jinja string) or use prompt/completion columns.")
    if packing and not max_length:
        raise ValueError("`packing=True` needs `max_length` (the block length).")
    if group_column is not None and group_column not in dataset.column_names:
        raise ValueError(f"`group_column`={group_column!r} is not a column of the dataset ({dataset.column_names}).")
    head = len(_special(tokenizer, True, False)[0])

    def one(row):
        if fmt == "messages":
            out = _messages(tokenizer, row["messages"])
        elif fmt == "prompt_completion":
            out = _prompt_completion(tokenizer, row["prompt"], row["completion"], add_eos)
        else:
            out = _text(tokenizer, row["text"], add_eos)
        fits = True
        if max_length and not packing and len(out["input_ids"]) > max_length:
            if fmt == "prompt_completion":
                cut = _cut_prompt(out, max_length, head)
                fits, out = cut is not None, cut or {"input_ids": [], "labels": []}
            else:
                out = {k: v[:max_length] for k, v in out.items()}
        out["attention_mask"] = [1] * len(out["input_ids"])
        return {**out, "_fits": fits}

    tokenized = dataset.map(one, remove_columns=list(SFT_FORMATS[fmt]), desc="tokenising SFT data",
                            new_fingerprint=_fingerprint(dataset, tokenizer, fmt, max_length, packing, add_eos))
    too_long = len(tokenized) - sum(tokenized["_fits"])
    if too_long:
        warnings.warn(f"Dropped {too_long} of {len(tokenized)} prompt/completion rows whose completion does not fit "
                      f"max_length={max_length} with a prompt token: raise max_length to keep them.", UserWarning,
                      stacklevel=2)
        tokenized = tokenized.filter(lambda r: r["_fits"], desc="dropping completions over max_length")
    tokenized = drop_unlabelled(tokenized.remove_columns("_fits"), "rows")
    if not packing:
        return tokenized
    return drop_unlabelled(pack(tokenized, max_length, group_column), "packed blocks")


def _blocks(rows: datasets.Dataset, block: int) -> Dict[str, list]:
    ids = [t for seq in rows["input_ids"] for t in seq]
    labels = [t for seq in rows["labels"] for t in seq]
    starts = [0] * len(ids)  # 1 where a document starts
    at = 0
    for seq in rows["input_ids"]:
        if seq:
            starts[at] = 1
        at += len(seq)
    out: Dict[str, list] = {"input_ids": [], "labels": [], "position_ids": []}
    for i in range(0, len(ids), block):
        positions, p = [], 0
        for j in range(i, min(i + block, len(ids))):
            p = 0 if starts[j] or j == i else p + 1  # a document's piece in this block counts from 0
            positions.append(p)
        out["input_ids"].append(ids[i:i + block])
        # a document's first token would be predicted from the previous document: not a label
        out["labels"].append([IGNORE_INDEX if q == 0 else t for t, q in zip(labels[i:i + block], positions)])
        out["position_ids"].append(positions)
    return out


def pack(tokenized: datasets.Dataset, block: int, group_column: Optional[str] = None) -> datasets.Dataset:
    """Concatenate and cut into ``block``-token rows (the last one shorter), within each ``group_column`` value:
    ``input_ids``, ``labels`` and per-document ``position_ids`` (module docstring); every token kept once."""
    if group_column is None:
        return datasets.Dataset.from_dict(_blocks(tokenized, block))
    values = tokenized[group_column]
    columns: Dict[str, list] = {**{k: [] for k in PACKED_COLUMNS}, group_column: []}
    for value in sorted(set(values)):
        part = _blocks(tokenized.select([i for i, v in enumerate(values) if v == value]), block)
        for k, v in part.items():
            columns[k].extend(v)
        columns[group_column].extend([value] * len(part["input_ids"]))
    features = datasets.Features({**{k: tokenized.features["input_ids"] for k in PACKED_COLUMNS},
                                  group_column: tokenized.features[group_column]})
    return datasets.Dataset.from_dict(columns, features=features)


@dataclass
class SFTCollator:
    """Pads each batch to its longest row (dynamic padding): ``input_ids`` with the pad token (EOS if the tokenizer
    has none), ``attention_mask`` with 0 and ``labels`` with -100, on the right. Only these three columns go to the
    model; the others (the split's category) stay in the dataset.

    Packed rows (:func:`pack`) go padding-free: ``input_ids``, ``labels`` and ``position_ids`` (padding with 0,
    each padding token then a document of its own), no ``attention_mask``, and ``use_cache=False``. sdpa and eager
    attention keep the documents apart in a batch of several rows; flash-attention's varlen path reads the
    boundaries from ``position_ids`` only in a one-row batch, so with ``attn_implementation="flash_attention_2"``
    set ``padding_free=True``: the batch's blocks are concatenated into one row (as trl's padding-free collator
    does; sdpa and eager then attend over the whole row, (rows x block)^2 instead of rows x block^2)."""

    tokenizer: object
    pad_to_multiple_of: Optional[int] = None
    padding_free: bool = False

    def __post_init__(self) -> None:
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("The tokenizer has neither a pad nor an EOS token: set `tokenizer.pad_token`.")

    def __call__(self, rows: List[dict]) -> Dict[str, torch.Tensor]:
        packed = "position_ids" in rows[0]
        for column in PACKED_COLUMNS if packed else TOKEN_COLUMNS:
            if column not in rows[0]:
                raise ValueError(f"SFTCollator needs `{column}` in every row: tokenise with "
                                 "fedhf.data.sft.tokenize_sft.")
        if packed and self.padding_free:
            rows = [{k: [t for r in rows for t in r[k]] for k in PACKED_COLUMNS}]
        length = max(len(r["input_ids"]) for r in rows)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        fill = {"input_ids": self.pad_id, "labels": IGNORE_INDEX, **({"position_ids": 0} if packed else
                                                                       {"attention_mask": 0})}
        batch = {k: torch.tensor([list(r[k]) + [v] * (length - len(r[k])) for r in rows], dtype=torch.long)
                 for k, v in fill.items()}
        if packed:
            # A model with a cache builds a plain causal mask and reads no document boundary from position_ids.
            batch["use_cache"] = False
        return batch
