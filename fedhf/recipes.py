"""Sectioned recipes for the ``fedhf`` command: what model, which data, which LoRA, which FederatedConfig.

A recipe is a YAML file with four sections (``lora`` is optional)::

    model: {name_or_path: bundled-minilm, task: sequence-classification, num_labels: 3}
    lora:  {r: 16, lora_alpha: 32, target_modules: [query, value]}     # peft.LoraConfig keyword arguments
    data:  {dataset: bundled-tweets, train_rows: 8000, eval_rows: 500, max_length: 64}
    train: {algorithm: scaffold, num_clients: 12, ...}                  # FederatedConfig fields

Every key is checked before any model or data is loaded, so a typo fails naming it. A task is one entry of
:data:`TASKS` (task name -> builder of model, datasets, collator, metrics and callbacks): sequence and image
classification, and causal-LM SFT (``causal-lm``: prompt/completion, chat ``messages`` or ``text`` data as
:mod:`fedhf.data.sft` reads them). A new task is one function plus one registry line. This module is the only
place the demo loaders (``bundled-*`` names, :mod:`fedhf.data.demo`) are imported from.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
import yaml
from transformers.utils import logging

from .runtime.hardware import cpu_has_bf16_matmul
from .trainer.config.federated_config import FederatedConfig
from .data import bundled_gemma
from .data.demo import load_digits_images, load_tweet_instructions, load_tweets, minilm_path, subsample
from .metrics import accuracy_metrics

BUNDLED_MODELS: Dict[str, Callable[[], str]] = {"bundled-minilm": minilm_path,
                                                bundled_gemma.NAME: bundled_gemma.gemma_3_270m_path}
LOCAL_DATA_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_TRUE = {"1", "ON", "YES", "TRUE"}
logger = logging.get_logger(__name__)


@dataclass
class ModelSection:
    task: str
    name_or_path: Optional[str] = None  # a Hub id, a local directory, or a bundled name (BUNDLED_MODELS)
    num_labels: Optional[int] = None  # default: the number of classes of the data's `label` column
    config: Optional[Dict[str, Any]] = None  # a model built from this config (AutoConfig.for_model kwargs)
    tokenizer: Optional[str] = None  # causal-lm: where the tokenizer comes from (default: name_or_path)
    quantization: Optional[Dict[str, Any]] = None  # causal-lm: BitsAndBytesConfig kwargs (QLoRA)


@dataclass
class DataSection:
    dataset: str  # a bundled name (BUNDLED_DATASETS), a local file/directory, or a Hub dataset id
    train_rows: Optional[int] = None  # subsample the training split (seeded by train.seed); None = all
    eval_rows: Optional[int] = None
    max_length: int = 64  # text tasks: truncation length in tokens
    text_column: str = "text"
    image_size: int = 8  # bundled-digits: side of the (resized) images
    generation_rows: int = 0  # causal-lm: held-out prompt/completion rows also scored by generation


BUNDLED_DATASETS: Dict[str, Callable[[DataSection], Any]] = {
    "bundled-tweets": lambda data: load_tweets(),
    "bundled-digits": lambda data: load_digits_images(size=data.image_size),
    "bundled-tweets-instructions": lambda data: load_tweet_instructions(),
}


@dataclass
class Built:
    """What a task builder hands to FederatedTrainer."""
    model: Any
    train_dataset: Any
    eval_dataset: Any
    data_collator: Any = None
    processing_class: Any = None
    compute_metrics: Any = None
    callbacks: List[Any] = field(default_factory=list)


@dataclass
class Recipe:
    path: str
    model: ModelSection
    data: DataSection
    train: Dict[str, Any]
    lora: Optional[Dict[str, Any]] = None

    def training_arguments(self, overrides=()) -> FederatedConfig:
        """The ``train:`` section as a FederatedConfig, with ``--field value`` overrides applied: exact field names
        only (no argparse abbreviations), and a bad value raises (argparse.ArgumentError) instead of exiting."""
        from transformers import HfArgumentParser

        parser = HfArgumentParser(FederatedConfig, allow_abbrev=False, exit_on_error=False)
        parser.set_defaults(**self.train)
        (args,) = parser.parse_args_into_dataclasses(args=bf16_auto_flag(list(overrides), self.train))
        return args


def _offline(*names: str) -> Optional[str]:
    return next((n for n in names if os.environ.get(n, "").strip().upper() in _TRUE), None)


def _section(values: Any, cls, name: str, path: str):
    if not isinstance(values, dict):
        raise ValueError(f"{path}: section `{name}:` must be a mapping of keys, got {type(values).__name__}.")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown} in section `{name}:`; known: {sorted(known)}.")
    try:
        return cls(**values)
    except TypeError as err:
        raise ValueError(f"{path}: section `{name}:` {err}.") from None


def _check_keys(values: Any, known: set, name: str, path: str, where: str) -> dict:
    if not isinstance(values, dict):
        raise ValueError(f"{path}: section `{name}:` must be a mapping of keys, got {type(values).__name__}.")
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown} in section `{name}:` (not {where}).")
    return dict(values)


def _resolve_bf16(train: Dict[str, Any]) -> Dict[str, Any]:
    """``bf16: auto`` in a recipe: bf16 where it runs in hardware (a CUDA GPU with bf16; a CPU with AVX512-BF16 or
    AMX), fp32 elsewhere -- emulated bf16 made a MiniLM-LoRA step 17x slower on an AVX2 CPU
    (:func:`fedhf.trainer.config.config_checks.cpu_has_bf16_matmul`). Any other value is left to FederatedConfig."""
    if train.get("bf16") != "auto":
        return train
    on_gpu = not train.get("use_cpu") and torch.cuda.is_available()
    return {**train, "bf16": bool(torch.cuda.is_bf16_supported() if on_gpu else cpu_has_bf16_matmul())}


def bf16_auto_flag(overrides: List[str], train: Dict[str, Any]) -> List[str]:
    """``--bf16 auto`` (or ``--bf16=auto``) on the command line means what ``bf16: auto`` means in a recipe
    (:func:`_resolve_bf16`), with ``--use_cpu`` from the same command line."""
    out = list(overrides)
    use_cpu = {**train}.get("use_cpu", False)
    for i, flag in enumerate(out[:-1]):
        if flag == "--use_cpu":
            use_cpu = str(out[i + 1]).strip().lower() in ("1", "true", "yes", "on")
    for i, flag in enumerate(out):
        if flag == "--bf16=auto" or (flag == "--bf16" and i + 1 < len(out) and out[i + 1] == "auto"):
            value = str(_resolve_bf16({"use_cpu": use_cpu, "bf16": "auto"})["bf16"])
            out[i:i + (1 if flag == "--bf16=auto" else 2)] = ["--bf16", value]
            break
    return out


def load_recipe(path: str) -> Recipe:
    """Read and check a recipe; loads nothing (no model, no data), so bad input fails before any work."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Recipe {path!r} does not exist (--config).")
    with open(path) as f:
        values = yaml.safe_load(f) or {}
    sections = {"model", "lora", "data", "train"}
    unknown = sorted(set(values) - sections) if isinstance(values, dict) else ["<not a mapping>"]
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {unknown}; a recipe has {sorted(sections)}.")
    missing = sorted({"model", "data", "train"} - set(values))
    if missing:
        raise ValueError(f"{path}: missing section(s) {missing}.")
    from peft import LoraConfig

    train_fields = {f.name for f in dataclasses.fields(FederatedConfig) if f.init}
    lora_fields = {f.name for f in dataclasses.fields(LoraConfig) if f.init}
    recipe = Recipe(
        path=path, model=_section(values["model"], ModelSection, "model", path),
        data=_section(values["data"], DataSection, "data", path),
        train=_resolve_bf16(_check_keys(values["train"], train_fields, "train", path, "a FederatedConfig field")),
        lora=None if values.get("lora") is None else _check_keys(values["lora"], lora_fields, "lora", path,
                                                                  "a peft.LoraConfig argument"))
    if recipe.model.task not in TASKS:
        raise ValueError(f"{path}: unknown `model.task` {recipe.model.task!r}; registered tasks: {sorted(TASKS)}.")
    if (recipe.model.name_or_path is None) == (recipe.model.config is None):
        raise ValueError(f"{path}: give exactly one of `model.name_or_path` (pretrained) and `model.config` "
                         "(a model built from a config).")
    for field_name, source in (("name_or_path", recipe.model.name_or_path), ("tokenizer", recipe.model.tokenizer)):
        if source is not None:
            _check_model_source(source, f"model.{field_name}")
    if recipe.model.task != "causal-lm" and (recipe.model.tokenizer or recipe.model.quantization
                                             or recipe.data.generation_rows):
        raise ValueError(f"{path}: `model.tokenizer`, `model.quantization` and `data.generation_rows` are for "
                         "`model.task: causal-lm`.")
    if recipe.model.task == "causal-lm" and recipe.model.config is not None and recipe.model.tokenizer is None:
        raise ValueError(f"{path}: a causal LM built from `model.config` needs `model.tokenizer` (its vocabulary).")
    _check_data_source(recipe.data.dataset)
    return recipe


def _check_model_source(name: str, field_name: str) -> None:
    if name.startswith("bundled-"):
        if name not in BUNDLED_MODELS:
            raise ValueError(f"Unknown bundled model {name!r} in `{field_name}`; bundled: "
                             f"{sorted(BUNDLED_MODELS)}.")
        return
    if os.path.isdir(name):
        return
    if name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1):
        raise FileNotFoundError(f"`{field_name}` {name!r} is neither a local directory nor a Hub id.")
    flag = _offline("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    if flag:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ValueError(f"`{field_name}` {name!r} is a Hub id that is not in the local cache, and "
                             f"{flag}=1 forbids downloading it: unset {flag}, or give a local directory or a "
                             f"bundled model ({sorted(BUNDLED_MODELS)}).")


def _check_data_source(name: str) -> None:
    if name.startswith("bundled-"):
        if name not in BUNDLED_DATASETS:
            raise ValueError(f"Unknown bundled dataset {name!r} in `data.dataset`; bundled: "
                             f"{sorted(BUNDLED_DATASETS)}.")
        return
    if os.path.exists(name):
        if os.path.isfile(name) and os.path.splitext(name)[1] not in LOCAL_DATA_FORMATS:
            raise ValueError(f"`data.dataset` {name!r}: local files must be one of {sorted(LOCAL_DATA_FORMATS)}.")
        return
    if name.startswith((".", "/", "~")) or os.path.splitext(name)[1] in LOCAL_DATA_FORMATS:
        raise FileNotFoundError(f"`data.dataset` {name!r} does not exist.")
    flag = _offline("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    if flag:
        raise ValueError(f"`data.dataset` {name!r} is a Hub dataset id and {flag}=1 forbids downloading it: unset "
                         f"{flag}, or give local files or a bundled dataset ({sorted(BUNDLED_DATASETS)}).")


def load_splits(data: DataSection, seed: int):
    """{"train", "test"} of the recipe's data, subsampled to train_rows / eval_rows with ``seed``."""
    import datasets

    if data.dataset in BUNDLED_DATASETS:
        splits = BUNDLED_DATASETS[data.dataset](data)
    elif os.path.isfile(data.dataset):
        kind = LOCAL_DATA_FORMATS[os.path.splitext(data.dataset)[1]]
        splits = datasets.load_dataset(kind, data_files=data.dataset)
    else:
        splits = datasets.load_dataset(data.dataset)
    if "test" not in splits:
        splits = splits["train"].train_test_split(test_size=0.1, seed=seed)
    return datasets.DatasetDict(train=subsample(splits["train"], data.train_rows, seed=seed),
                                test=subsample(splits["test"], data.eval_rows, seed=seed))


def _num_labels(recipe: Recipe, splits) -> int:
    if recipe.model.num_labels is not None:
        return recipe.model.num_labels
    feature = splits["train"].features.get("label")
    if feature is None or not hasattr(feature, "num_classes"):
        raise ValueError(f"{recipe.path}: set `model.num_labels` (the data's `label` column is not a ClassLabel).")
    return feature.num_classes


def _with_lora(model, recipe: Recipe, task_type: Optional[str]):
    if recipe.lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    from .runtime.library_notices import quiet_peft_wrap

    with quiet_peft_wrap():
        return get_peft_model(model, LoraConfig(**{"task_type": task_type, **recipe.lora}))


def build_sequence_classification(recipe: Recipe, splits) -> Built:
    """A pretrained encoder with a fresh classification head; text tokenised unpadded (padded per batch)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    path = resolve_model(recipe.model.name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    column, length = recipe.data.text_column, recipe.data.max_length
    splits = splits.map(lambda b: tokenizer(b[column], truncation=True, max_length=length), batched=True,
                        remove_columns=[column])
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=_num_labels(recipe, splits))
    return Built(_with_lora(model, recipe, "SEQ_CLS"), splits["train"], splits["test"],
                 DataCollatorWithPadding(tokenizer), tokenizer, compute_metrics=accuracy_metrics)


def build_image_classification(recipe: Recipe, splits) -> Built:
    """A pretrained image classifier, or one built from ``model.config`` (e.g. a tiny ResNetConfig)."""
    from transformers import AutoConfig, AutoModelForImageClassification

    num_labels = _num_labels(recipe, splits)
    if recipe.model.config is not None:
        config = AutoConfig.for_model(**{"num_labels": num_labels, **recipe.model.config})
        model = AutoModelForImageClassification.from_config(config)
    else:
        model = AutoModelForImageClassification.from_pretrained(resolve_model(recipe.model.name_or_path),
                                                                num_labels=num_labels)
    return Built(_with_lora(model, recipe, None), splits["train"], splits["test"], compute_metrics=accuracy_metrics)


def build_causal_lm(recipe: Recipe, splits) -> Built:
    """Causal-LM SFT: the loss on completion / assistant tokens only (:func:`fedhf.data.sft.tokenize_sft`), rows
    padded per batch. A pretrained model (4/8-bit with ``model.quantization``, prepared for k-bit training), or
    one built from ``model.config`` with ``model.tokenizer``'s vocabulary. Each evaluation reports perplexity,
    and with ``data.generation_rows`` the first-word accuracy of greedy answers to that many held-out prompts."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from .data.sft import SFTCollator, tokenize_sft
    from .metrics import GenerationEvalCallback

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(recipe.model.tokenizer or recipe.model.name_or_path))
    if recipe.model.config is not None:
        config = AutoConfig.for_model(**{"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                                         **recipe.model.config})
        model = AutoModelForCausalLM.from_config(config)
    else:
        quantised = {}
        if recipe.model.quantization:
            from transformers import BitsAndBytesConfig

            quantised["quantization_config"] = BitsAndBytesConfig(**recipe.model.quantization)
        model = AutoModelForCausalLM.from_pretrained(resolve_model(recipe.model.name_or_path), **quantised)
        if quantised:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model)
    held_out = splits["test"]
    rows = min(recipe.data.generation_rows, len(held_out))
    short = generation_rows_warning(recipe.data.generation_rows, len(held_out))
    if short:
        logger.warning(short)
    if rows and not {"prompt", "completion"} <= set(held_out.column_names):
        raise ValueError(f"{recipe.path}: `data.generation_rows` scores answers to prompts: the data needs `prompt` "
                         f"and `completion` columns, it has {held_out.column_names}.")
    prompts, answers = (held_out[:rows]["prompt"], held_out[:rows]["completion"]) if rows else ((), ())
    train = tokenize_sft(splits["train"], tokenizer, max_length=recipe.data.max_length)
    test = tokenize_sft(held_out, tokenizer, max_length=recipe.data.max_length)
    return Built(_with_lora(model, recipe, "CAUSAL_LM"), train, test, SFTCollator(tokenizer), tokenizer,
                 callbacks=[GenerationEvalCallback(tokenizer, prompts, answers)])


def generation_rows_warning(asked: int, held_out: int) -> Optional[str]:
    """``data.generation_rows`` beyond the held-out rows: only those are scored (they are the eval rows: the
    prompts are held out from training either way), which the user should know rather than read 5/32 as 5/50."""
    if asked <= held_out:
        return None
    return (f"`data.generation_rows`={asked} but the held-out split has {held_out} rows (`data.eval_rows`): "
            f"generation accuracy is scored on {held_out} prompts, the eval rows. Set `data.eval_rows` to {asked} "
            "or more to score them all.")


def resolve_model(name: str) -> str:
    return BUNDLED_MODELS[name]() if name in BUNDLED_MODELS else name


# Task name -> builder(recipe, splits) -> Built. A new task is one function and one line here.
TASKS: Dict[str, Callable[[Recipe, Any], Built]] = {
    "sequence-classification": build_sequence_classification,
    "image-classification": build_image_classification,
    "causal-lm": build_causal_lm,
}
