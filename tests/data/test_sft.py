"""SFT tokenisation: labels exactly on completion / assistant tokens (token by token, MiniLM's WordPiece
tokenizer), packing keeps every token once, dynamic padding, clear errors."""

import datasets
import pytest
import torch

from fedhf.data.sft import IGNORE_INDEX, SFTCollator, pack, tokenize_sft
from fedhf.data.demo import tiny_llama

# A small explicit template (MiniLM's tokenizer ships none): role header, content, end-of-turn marker.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} [SEP] {% endfor %}"
            "{% if add_generation_prompt %}<assistant> {% endif %}")


@pytest.fixture
def chat_tokenizer(tokenizer):
    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture
def bos_tokenizer(tokenizer):
    """MiniLM's tokenizer with a BOS and an EOS (its [CLS] and [SEP]), as Llama-family tokenizers have."""
    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tok.bos_token, tok.eos_token = "[CLS]", "[SEP]"
    return tok


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_prompt_completion_labels_only_the_completion(tokenizer):
    ds = datasets.Dataset.from_dict({"prompt": ["Tweet: what a lovely day\nSentiment:"], "completion": [" positive"],
                                     "label": [2]})
    row = tokenize_sft(ds, tokenizer)[0]
    prompt, completion = ids(tokenizer, "Tweet: what a lovely day\nSentiment:"), ids(tokenizer, " positive")
    assert row["input_ids"] == prompt + completion  # MiniLM has no BOS/EOS: nothing added
    assert row["labels"] == [IGNORE_INDEX] * len(prompt) + completion
    assert row["attention_mask"] == [1] * len(row["input_ids"])
    assert row["label"] == 2  # other columns kept for the split


def test_eos_appended_and_labelled(tokenizer):
    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tok.eos_token = "[SEP]"
    row = tokenize_sft(datasets.Dataset.from_dict({"prompt": ["a b"], "completion": [" c"]}), tok)[0]
    assert row["input_ids"][-1] == tok.sep_token_id and row["labels"][-2:] == [ids(tok, "c")[0], tok.sep_token_id]


def test_chat_labels_exactly_the_assistant_turns(chat_tokenizer):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "hi friend"}, {"role": "user", "content": "how are you"},
                {"role": "assistant", "content": "very well"}]
    row = tokenize_sft(datasets.Dataset.from_dict({"messages": [messages]}), chat_tokenizer)[0]
    rendered = chat_tokenizer.apply_chat_template(messages, tokenize=False)
    assert row["input_ids"] == ids(chat_tokenizer, rendered)
    sep = chat_tokenizer.sep_token_id
    # Token by token: the labelled tokens are each assistant turn's content then its end-of-turn [SEP], in order.
    labelled = [(i, t) for i, t in enumerate(row["labels"]) if t != IGNORE_INDEX]
    expected = ids(chat_tokenizer, "hi friend") + [sep] + ids(chat_tokenizer, "very well") + [sep]
    assert [t for _, t in labelled] == expected
    for i, t in labelled:
        assert row["input_ids"][i] == t
    # and the user/system contents and the role headers carry none
    assert len(labelled) == len(expected) < len(row["input_ids"]) - 10


def test_text_labels_every_token(tokenizer):
    row = tokenize_sft(datasets.Dataset.from_dict({"text": ["plain language modelling"]}), tokenizer, max_length=2)[0]
    assert row["labels"] == row["input_ids"] == ids(tokenizer, "plain language modelling")[:2]


def test_packing_keeps_every_token_exactly_once(tokenizer):
    texts = [f"tweet number {i} says " + "word " * (i % 7) for i in range(30)]
    ds = datasets.Dataset.from_dict({"prompt": texts, "completion": [" positive", " negative"] * 15,
                                     "label": [0, 1] * 15})
    plain = tokenize_sft(ds, tokenizer)
    packed = tokenize_sft(ds, tokenizer, max_length=16, packing=True)
    flat = lambda d, k: [t for seq in d[k] for t in seq]
    assert flat(packed, "input_ids") == flat(plain, "input_ids")
    assert all(len(s) == 16 for s in packed["input_ids"][:-1]) and 0 < len(packed["input_ids"][-1]) <= 16
    # positions restart at every document and every block; a piece's first token is no label (nothing before it)
    lengths = [len(r) for r in plain["input_ids"]]
    doc_positions = [p for n in lengths for p in range(n)]
    positions = flat(packed, "position_ids")
    block_start = [i % 16 == 0 for i in range(len(positions))]
    for i, (p, start) in enumerate(zip(doc_positions, block_start)):
        assert positions[i] == (0 if start or p == 0 else positions[i - 1] + 1)
    assert flat(packed, "labels") == [IGNORE_INDEX if q == 0 else t for t, q in zip(flat(plain, "labels"), positions)]
    assert "attention_mask" not in packed.column_names
    grouped = pack(plain, 16, group_column="label")
    assert sorted(flat(grouped, "input_ids")) == sorted(flat(plain, "input_ids"))
    for block, label in zip(grouped["labels"], grouped["label"]):  # a block holds only its group's completions
        word = "positive" if label == 0 else "negative"
        assert [t for t in block if t != IGNORE_INDEX] == ids(tokenizer, word) * len(
            [t for t in block if t != IGNORE_INDEX])


def test_collator_pads_dynamically(tokenizer):
    ds = tokenize_sft(datasets.Dataset.from_dict({"prompt": ["a", "a b c d"], "completion": [" x", " y"]}), tokenizer)
    batch = SFTCollator(tokenizer)([ds[0], ds[1]])
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == (2, 5)
    assert batch["input_ids"][0, 2:].tolist() == [tokenizer.pad_token_id] * 3
    assert batch["attention_mask"][0].tolist() == [1, 1, 0, 0, 0]
    assert batch["labels"][0].tolist() == [IGNORE_INDEX, ids(tokenizer, "x")[0]] + [IGNORE_INDEX] * 3
    assert SFTCollator(tokenizer, pad_to_multiple_of=8)([ds[0]])["input_ids"].shape == (1, 8)


def test_errors_name_the_missing_piece(tokenizer):
    with pytest.raises(ValueError, match="no `completion` column"):
        tokenize_sft(datasets.Dataset.from_dict({"prompt": ["a"]}), tokenizer)
    with pytest.raises(ValueError, match="`prompt` \\+ `completion`.*`messages`.*`text`"):
        tokenize_sft(datasets.Dataset.from_dict({"question": ["a"]}), tokenizer)
    with pytest.raises(ValueError, match="no chat template"):
        tokenize_sft(datasets.Dataset.from_dict({"messages": [[{"role": "user", "content": "a"}]]}), tokenizer)
    with pytest.raises(ValueError, match="needs `max_length`"):
        tokenize_sft(datasets.Dataset.from_dict({"text": ["a"]}), tokenizer, packing=True)
    with pytest.raises(ValueError, match="needs `labels`"):
        SFTCollator(tokenizer)([{"input_ids": [1], "attention_mask": [1]}])


def test_long_prompt_is_cut_from_the_left_so_the_completion_survives(tokenizer):
    prompt = "Tweet: " + "long " * 40 + "\nSentiment:"
    row = tokenize_sft(datasets.Dataset.from_dict({"prompt": [prompt], "completion": [" neutral"]}), tokenizer,
                       max_length=8)[0]
    assert row["input_ids"] == (ids(tokenizer, prompt) + ids(tokenizer, " neutral"))[-8:]
    assert row["labels"] == [IGNORE_INDEX] * 7 + ids(tokenizer, " neutral")


def test_a_long_prompt_keeps_its_bos_and_an_overlong_completion_is_dropped(bos_tokenizer):
    tok = bos_tokenizer
    prompt, completion = "Tweet: " + "long " * 40 + "\nSentiment:", " neutral"
    ds = datasets.Dataset.from_dict({"prompt": [prompt, "Summarise: the cat sat"],
                                     "completion": [completion, " " + "word " * 30]})
    with pytest.warns(UserWarning, match="Dropped 1 of 2 prompt/completion rows whose completion does not fit "
                                         "max_length=8"):
        rows = tokenize_sft(ds, tok, max_length=8)
    assert len(rows) == 1
    tail = ids(tok, completion) + [tok.sep_token_id]  # the completion and its EOS, whole
    assert rows[0]["input_ids"] == [tok.cls_token_id] + ids(tok, prompt)[-(7 - len(tail)):] + tail
    assert rows[0]["labels"] == [IGNORE_INDEX] * (8 - len(tail)) + tail


def test_rows_left_without_a_label_token_are_dropped_with_a_count(chat_tokenizer):
    """A long system prompt cut from the right takes every assistant token with it: such a row would be a 0/0
    mean loss (NaN), so it is dropped, and counted."""
    short = [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi there"}]
    long = [{"role": "system", "content": "you are a helpful assistant " * 6}] + short
    ds = datasets.Dataset.from_dict({"messages": [short, long, short], "label": [0, 1, 2]})
    with pytest.warns(UserWarning, match="Dropped 1 of 3 rows without a label token"):
        rows = tokenize_sft(ds, chat_tokenizer, max_length=32)
    assert rows["label"] == [0, 2]
    assert all(any(t != IGNORE_INDEX for t in r) for r in rows["labels"])


def test_packed_rows_go_padding_free(bos_tokenizer):
    texts = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota kappa"]
    packed = tokenize_sft(datasets.Dataset.from_dict({"text": texts}), bos_tokenizer, max_length=7, packing=True)
    rows = [packed[i] for i in range(len(packed))]
    assert len(rows) == 3  # 5 + 4 + 8 tokens in blocks of 7, 7 and 3
    batch = SFTCollator(bos_tokenizer)(rows)
    assert set(batch) == {"input_ids", "labels", "position_ids", "use_cache"} and batch["use_cache"] is False
    short = len(rows[-1]["input_ids"])
    assert short == 3 and batch["position_ids"][-1, short:].tolist() == [0] * 4
    assert batch["labels"][-1, short:].tolist() == [IGNORE_INDEX] * 4
    flat = SFTCollator(bos_tokenizer, padding_free=True)(rows)
    assert flat["input_ids"].shape == (1, sum(len(r["input_ids"]) for r in rows))
    assert flat["position_ids"][0].tolist() == [p for r in rows for p in r["position_ids"]]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("padding_free", [False, True])
def test_a_packed_document_gives_the_logits_and_loss_it_gives_alone(bos_tokenizer, attention, padding_free):
    """Two blocks of two documents each (the second block padded): every document's logits in the packed batch
    are its logits alone, and the batch's loss is the per-token mean of the documents' own losses."""
    tok = bos_tokenizer
    texts = ["the first document is about the weather", "a second one about cats", "short third",
             "and the fourth document ends it"]
    alone = tokenize_sft(datasets.Dataset.from_dict({"text": texts}), tok)["input_ids"]
    block = len(alone[0]) + len(alone[1])
    assert len(alone[2]) + len(alone[3]) < block  # the second block is shorter: padded
    packed = tokenize_sft(datasets.Dataset.from_dict({"text": texts}), tok, max_length=block, packing=True)
    assert len(packed) == 2
    model = tiny_llama(len(tok), seed=1, attn_implementation=attention).train()  # Llama: no dropout
    batch = SFTCollator(tok, padding_free=padding_free)([packed[0], packed[1]])
    with torch.no_grad():
        out = model(**batch)
        logits = out.logits.reshape(-1, out.logits.shape[-1])
        # each document's first token in the batch, flattened (padding-free: the second block follows the first)
        rows = [0, len(alone[0]), block, block + len(alone[2])]
        loss_sum, count = 0.0, 0
        for start, doc in zip(rows, alone):
            own = model(input_ids=torch.tensor([doc]), labels=torch.tensor([doc]))
            torch.testing.assert_close(logits[start:start + len(doc)], own.logits[0], rtol=1e-5, atol=1e-5)
            loss_sum, count = loss_sum + own.loss.item() * (len(doc) - 1), count + len(doc) - 1
    assert out.loss.item() == pytest.approx(loss_sum / count, rel=1e-5)


def test_tokenising_never_pickles_the_tokenizer_and_its_settings_key_the_cache(tokenizer, monkeypatch):
    """datasets keys a map's cache by hashing the function, which pickles the tokenizer it closes over (a minute for
    Gemma's 262 K vocabulary); tokenize_sft gives the key itself, from what decides the result."""
    import copy

    import datasets.arrow_dataset

    rows = datasets.Dataset.from_dict({"prompt": ["Tweet: a\nSentiment:"] * 3, "completion": [" positive"] * 3})
    hashed = []
    update = datasets.arrow_dataset.update_fingerprint

    def spy(fingerprint, transform, transform_args):
        functions = [v for v in transform_args.values() if callable(v) and getattr(v, "__closure__", None)]
        hashed.extend(c.cell_contents for f in functions for c in f.__closure__)
        return update(fingerprint, transform, transform_args)

    monkeypatch.setattr(datasets.arrow_dataset, "update_fingerprint", spy)
    first = tokenize_sft(rows, tokenizer, max_length=16)
    assert not any(value is tokenizer for value in hashed)
    assert first._fingerprint == tokenize_sft(rows, tokenizer, max_length=16)._fingerprint
    assert first._fingerprint != tokenize_sft(rows, tokenizer, max_length=8)._fingerprint
    other = copy.copy(tokenizer)
    other.chat_template = "{{ messages }}"
    assert first._fingerprint != tokenize_sft(rows, other, max_length=16)._fingerprint


def test_chat_labels_are_what_assistant_only_loss_labels_on_the_gemma_template(gemma_dir):
    """The answer and its <end_of_turn>, not the template's newline after it: the tokens transformers' assistant mask
    (the template's {% generation %} marks, which trl's ``assistant_only_loss`` reads) selects."""
    from transformers import AutoTokenizer

    from fedhf.data.bundled_gemma import GEMMA_CHAT_TEMPLATE

    tok = AutoTokenizer.from_pretrained(gemma_dir)
    tok.chat_template = GEMMA_CHAT_TEMPLATE
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tweet: I love it\nSentiment?"},
            {"role": "assistant", "content": "positive"}, {"role": "user", "content": "And: I hate it"},
            {"role": "assistant", "content": "negative"}]
    row = tokenize_sft(datasets.Dataset.from_dict({"messages": [chat]}), tok)[0]
    marked = tok.apply_chat_template(chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert row["input_ids"] == marked["input_ids"]
    assert [t != IGNORE_INDEX for t in row["labels"]] == [bool(m) for m in marked["assistant_masks"]]
    assert tok.decode([t for t in row["labels"] if t != IGNORE_INDEX]) == "positive<end_of_turn>negative<end_of_turn>"


def test_the_cache_key_includes_the_tokenisation_code(tokenizer, tmp_path, monkeypatch):
    """A dataset backed by files caches tokenize_sft's rows on disk; after the code changes (a fedhf upgrade, here
    a patched row function) the new rows come back, not the cached old ones."""
    import fedhf.data.sft as sft

    datasets.Dataset.from_dict({"prompt": ["Tweet: good day\nSentiment:"], "completion": [" positive"]}).save_to_disk(
        str(tmp_path))
    data = datasets.load_from_disk(str(tmp_path))
    first = tokenize_sft(data, tokenizer, max_length=32)[0]["labels"]
    original = sft._prompt_completion

    def only_the_last_token(*args):
        out = original(*args)
        return {**out, "labels": [IGNORE_INDEX] * (len(out["labels"]) - 1) + [7]}

    monkeypatch.setattr(sft, "_prompt_completion", only_the_last_token)
    changed = tokenize_sft(datasets.load_from_disk(str(tmp_path)), tokenizer, max_length=32)[0]["labels"]
    assert changed != first and changed[-1] == 7 and changed[:-1] == [IGNORE_INDEX] * (len(first) - 1)
