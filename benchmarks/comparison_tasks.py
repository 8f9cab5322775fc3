"""The three tasks of the algorithm comparison (benchmarks/algorithms.py): their data, models and budgets.

* ``tweets``: pretrained MiniLM-L6 + LoRA r8 (query, value; classifier head trained) on the bundled
  3-class sentiment tweets, dynamic padding, at most 32 tokens.
* ``digits``: a small convnet (three conv layers with GroupNorm, 24k parameters, all trained) on scikit-learn's
  8x8 digits.
* ``llm``: causal-LM SFT of a small Llama built from a config (2 layers, hidden 64, MiniLM's 30,522-token
  vocabulary, ~2.1 M parameters, all trained) on the bundled tweets as instruction pairs ("Tweet: ...\\nSentiment:"
  -> " positive"), the loss on the answer tokens only -- recipes/tweets_tinyllama_sft_fedmuon_dir0.5_n8.yaml's model
  and data. Scored by eval loss and the first-word accuracy of greedy answers to the held-out prompts.
* ``llm-lora``: the same model with LoRA r8 adapters on every attention and MLP projection and the final RMSNorm's
  64 weights trained, for the LoRA aggregation rules (benchmarks/lora_federation.py). The base is random (drawn at
  initializer_range 0.2, see ``LORA_BASE_INIT``), not pretrained: what the adapters learn is to steer its hidden
  states towards the answers' (frozen, tied) embeddings.

Every task trains in fp32 (benchmarks/algorithms.py ``run_settings``). Every task also has a validation split
for tuning: ``VALIDATION_FRACTION`` of the training rows (seeded, the same for every algorithm), held out of the
clients' data; the tuned runs never see the test rows.
"""

from __future__ import annotations

import os

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
LLM_RECIPE = os.path.join(HERE, "..", "recipes", "tweets_tinyllama_sft_fedmuon_dir0.5_n8.yaml")
TASKS = ["tweets", "digits", "llm", "llm-lora"]
# What the tuning ranks by: (history key, "max" or "min"). The llm task by its answers, not its eval loss: at 60
# rounds the loss-chosen lrs were the ones that answer with the label prior (loss ~1.2, near ln 3 plus the answer
# format; FedPAC_Muon 1.198 at 0.38 accuracy) over ones that learned the label (2.53 at 0.57, overconfident).
SCORE = {"tweets": ("eval_accuracy", "max"), "digits": ("eval_accuracy", "max"),
         "llm": ("eval_generation_accuracy", "max"), "llm-lora": ("eval_loss", "min")}
# The accuracy column and its target, whose first crossing gives "MB to target": well above the majority class
# (tweets 0.42 on the eval rows, digits 0.10, llm 0.42 of first words).
ACCURACY = {"tweets": "eval_accuracy", "digits": "eval_accuracy", "llm": "eval_generation_accuracy",
            "llm-lora": "eval_generation_accuracy"}
TARGETS = {"tweets": 0.50, "digits": 0.80, "llm": 0.55, "llm-lora": 0.55}
VALIDATION_FRACTION = 0.2
BUDGETS = {
    "quick": {"tweets": dict(train_rows=1000, eval_rows=100, num_clients=20, clients_per_round=5, local_steps=2,
                             num_rounds=3, batch_size=16),
              "digits": dict(num_clients=20, clients_per_round=5, local_steps=3, num_rounds=3, batch_size=32),
              "llm": dict(train_rows=2000, eval_rows=100, num_clients=20, clients_per_round=5, local_steps=2,
                          num_rounds=3, batch_size=8)},
    # tweets: 20 rounds (evaluated every 2nd): at 10 the global model still swung between classes from round to
    # round (Dirichlet 0.1, 5 of 20 clients a round), so the last round's accuracy was a draw, not a ranking
    "full": {"tweets": dict(train_rows=2000, eval_rows=200, num_clients=20, clients_per_round=5, local_steps=5,
                            num_rounds=20, batch_size=16, eval_every_rounds=2),
             "digits": dict(num_clients=20, clients_per_round=5, local_steps=10, num_rounds=20, batch_size=32),
             # llm: 60 rounds (evaluated every 10th): at 20 FedAvg's answers were still within noise of the
             # majority class (0.475 +- 0.089 at lr 0.3); its validation run reached 0.595 at round 60
             "llm": dict(train_rows=2000, eval_rows=200, num_clients=20, clients_per_round=5, local_steps=5,
                         num_rounds=60, batch_size=8, eval_every_rounds=10)},
}


def load_data(task: str, settings: dict) -> dict:
    """{"train", "test", "arrow_train", "collator", "tokenizer", "callbacks"}: the same rows for every algorithm and
    seed; "arrow_train" is the training split as a ``datasets.Dataset``, which fedhf splits over the clients."""
    from fedhf.data.demo import load_digits_images, load_tweets, minilm_path, subsample, tokenize_tweets

    if task == "digits":
        splits = load_digits_images()
        return {**{k: in_memory(v, tensors=True) for k, v in splits.items()}, "arrow_train": splits["train"],
                "collator": None, "tokenizer": None, "callbacks": []}
    if task.startswith("llm"):
        return load_llm_data(settings)
    from transformers import AutoTokenizer, DataCollatorWithPadding

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    splits = load_tweets()
    splits["train"] = subsample(splits["train"], settings["train_rows"], seed=0)
    splits["test"] = subsample(splits["test"], settings["eval_rows"], seed=0)
    splits = tokenize_tweets(splits, tokenizer, max_length=settings["max_length"])
    return {"train": in_memory(splits["train"]), "test": in_memory(splits["test"]), "arrow_train": splits["train"],
            "collator": DataCollatorWithPadding(tokenizer), "tokenizer": tokenizer, "callbacks": []}


def load_llm_data(settings: dict) -> dict:
    """The recipe's SFT rows; the generation callback answers the evaluated rows' prompts (validation or test)."""
    import datasets

    from fedhf.data.sft import SFTCollator, tokenize_sft
    from fedhf.metrics import GenerationEvalCallback
    from fedhf.recipes import load_recipe, load_splits, resolve_model
    from transformers import AutoTokenizer

    recipe = load_recipe(LLM_RECIPE)
    recipe.data.train_rows, recipe.data.eval_rows = settings["train_rows"], settings["eval_rows"]
    splits = load_splits(recipe.data, seed=0)
    if settings.get("validation"):  # eval_rows of the held-out rows: generation costs as much as on the test rows
        held_out = validation_rows(splits["train"], held_out=True)
        splits = datasets.DatasetDict(train=validation_rows(splits["train"], held_out=False),
                                      test=held_out.select(range(min(settings["eval_rows"], len(held_out)))))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(recipe.model.tokenizer))
    train = tokenize_sft(splits["train"], tokenizer, max_length=recipe.data.max_length)
    test = tokenize_sft(splits["test"], tokenizer, max_length=recipe.data.max_length)
    held_out = splits["test"]
    return {"train": train, "test": test, "arrow_train": train, "collator": SFTCollator(tokenizer),
            "tokenizer": tokenizer, "model_config": dict(recipe.model.config),
            "callbacks": [GenerationEvalCallback(tokenizer, held_out["prompt"], held_out["completion"])]}


def validation_rows(dataset, held_out: bool):
    """The tuning split of a training ``datasets.Dataset``: ``VALIDATION_FRACTION`` of its rows (held_out) or the
    rest, drawn once with seed 0."""
    order = np.random.default_rng(0).permutation(len(dataset))
    cut = int(round(VALIDATION_FRACTION * len(dataset)))
    return dataset.select(sorted(order[:cut] if held_out else order[cut:]))


def with_validation(task: str, data: dict) -> dict:
    """Classification data with its test rows replaced by the validation rows, which leave the training rows."""
    rows = data["arrow_train"]
    keep, val = validation_rows(rows, held_out=False), validation_rows(rows, held_out=True)
    tensors = task == "digits"
    return {**data, "arrow_train": keep, "train": in_memory(keep, tensors), "test": in_memory(val, tensors)}


def in_memory(ds, tensors: bool = False) -> list:
    """Rows as a list of dicts: fetching 32 digit images from Arrow and collating their nested lists took 7.8 ms
    a batch, longer than the convnet's step; from a list of tensors it takes 0.02 ms."""
    rows = ds.to_list()
    if tensors:
        rows = [{k: torch.tensor(v) if isinstance(v, list) else v for k, v in row.items()} for row in rows]
    return rows


class SmallConvNet(torch.nn.Module):
    """Three 3x3 convolutions with GroupNorm, global average pooling and a linear head (24k parameters).

    Not the tests' tiny ResNet: its BatchNorm fails on a one-row batch, and under Dirichlet(0.1) some client
    always ends a pass with one (a client of 33 rows and batch 32), which fedhf's client loader does not drop.
    GroupNorm also keeps the comparison about the optimizers rather than about averaging BN statistics."""

    def __init__(self, num_labels: int = 10):
        super().__init__()
        layers, channels = [], 1
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            layers += [torch.nn.Conv2d(channels, width, 3, stride, 1), torch.nn.GroupNorm(4, width), torch.nn.ReLU()]
            channels = width
        self.features = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.classifier = torch.nn.Linear(channels, num_labels)

    def forward(self, pixel_values, labels=None):
        from transformers.modeling_outputs import ImageClassifierOutput

        logits = self.classifier(self.features(pixel_values))
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
        return ImageClassifierOutput(loss=loss, logits=logits)


# The LoRA task's random base is drawn at 10x Llama's default initializer_range. At 0.02 the tied embeddings have
# norm ~0.16, so with the final norm's output at norm 8 no logit can pass ~1.3: a loss floor of ln(30,522) - 1.3
# ~ 9.05 that adapters cannot cross (the first full FedAvg run stalled at 9.6; training the norm too, 7.4 at lr 3,
# 4.4 at lr 30). At 0.2 FedAvg-LoRA reaches 1.55 at lr 3 (seed 0), so the rules' curves can differ.
LORA_BASE_INIT = {"initializer_range": 0.2}


def build_model(task: str, seed: int, data: dict):
    """MiniLM-L6 + LoRA r8 (no dropout: faster on CPU, one noise source less), the small convnet, or the Llama."""
    torch.manual_seed(seed)
    if task == "digits":
        return SmallConvNet()
    from peft import LoraConfig, TaskType, get_peft_model

    if task.startswith("llm"):
        from transformers import AutoConfig, AutoModelForCausalLM

        tokenizer = data["tokenizer"]
        config = dict(data["model_config"], **LORA_BASE_INIT) if task == "llm-lora" else data["model_config"]
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
            vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **config))
        if task == "llm":
            return model
        # The final RMSNorm's 64 weights train too (modules_to_save, shared like a head); see LORA_BASE_INIT.
        return get_peft_model(model, LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, task_type=TaskType.CAUSAL_LM, modules_to_save=["norm"],
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    from transformers import AutoModelForSequenceClassification

    from fedhf.data.demo import minilm_path

    model = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=3, hidden_dropout_prob=0.0,
                                                               attention_probs_dropout_prob=0.0)
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["query", "value"],
                                            task_type=TaskType.SEQ_CLS))


for _budget in BUDGETS.values():  # the LoRA variant of the llm task trains on the same rows for as long
    _budget["llm-lora"] = _budget["llm"]
# The LoRA aggregation rules (lora_federation.py) were compared on tweets at 10 rounds, evaluated every round, and
# on llm-lora at 20 rounds, evaluated every 5th.
LORA_BUDGETS = {name: dict(tasks) for name, tasks in BUDGETS.items()}
LORA_BUDGETS["full"]["tweets"] = dict(train_rows=2000, eval_rows=200, num_clients=20, clients_per_round=5,
                                      local_steps=5, num_rounds=10, batch_size=16)
LORA_BUDGETS["full"]["llm-lora"] = dict(LORA_BUDGETS["full"]["llm-lora"], num_rounds=20, eval_every_rounds=5)
