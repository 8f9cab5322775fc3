"""The offline LLM stand-ins: tweets as instruction pairs and a tiny LlamaForCausalLM on MiniLM's vocabulary."""

import torch

from fedhf.data.demo import TWEET_LABELS, load_tweet_instructions, tiny_llama
from fedhf.data.sft import IGNORE_INDEX, SFTCollator, tokenize_sft


def test_tweet_instructions_and_tiny_llama(tokenizer):
    splits = load_tweet_instructions()
    assert set(splits["train"].column_names) == {"prompt", "completion", "label"}
    row = splits["train"][0]
    assert row["prompt"].startswith("Tweet: ") and row["prompt"].endswith("\nSentiment:")
    assert row["completion"] == " " + TWEET_LABELS[row["label"]]
    model = tiny_llama(tokenizer.vocab_size)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    data = tokenize_sft(splits["train"].select(range(4)), tokenizer, max_length=48)
    batch = SFTCollator(tokenizer)([data[i] for i in range(4)])
    loss = model(**batch).loss
    # untrained: about log(vocabulary) per completion token
    assert abs(loss.item() - torch.log(torch.tensor(float(len(tokenizer)))).item()) < 1.0
    assert (batch["labels"] != IGNORE_INDEX).sum() == 4  # one word per completion
