"""SFT tokenisation: labels exactly on completion / assistant tokens (token by token, MiniLM's WordPiece
tokenizer), packing keeps every token once, dynamic padding, clear errors."""

import datasets
import pytest

from fedhf.data.sft import IGNORE_INDEX, SFTCollator, pack, tokenize_sft

# A small explicit template (MiniLM's tokenizer ships none): role header, content, end-of-turn marker.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} [SEP] {% endfor %}"
            "{% if add_generation_prompt %}<assistant> {% endif %}")


@pytest.fixture
def chat_tokenizer(tokenizer):
    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tok.chat_template = TEMPLATE
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
    assert flat(packed, "labels") == flat(plain, "labels")
    assert all(len(s) == 16 for s in packed["input_ids"][:-1]) and 0 < len(packed["input_ids"][-1]) <= 16
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
