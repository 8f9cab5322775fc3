"""Data checks that run when ``FederatedTrainer`` is built, before the split, the partition report or any step.

Without them, string labels, labels the model's head cannot hold, untokenised text, ``None`` values or an eval set
without labels fail deep inside the collator or the loss (after partition.json/png were written), or silently give
no metrics. Each error names the dataset, the column and the fix.
"""

from __future__ import annotations

from typing import Iterable, List, Optional

import datasets
import torch

LABEL_COLUMNS = ("label", "labels", "label_ids")


def check_not_streaming(dataset, name: str) -> None:
    """The round loop draws each client's rows by index every round (random access): a stream cannot do that."""
    if isinstance(dataset, (datasets.IterableDataset, torch.utils.data.IterableDataset)):
        raise ValueError(
            f"`{name}` is an IterableDataset (streaming): federated clients need random access to their rows. "
            "Materialise it first, e.g. `datasets.Dataset.from_generator(lambda: (yield from stream))`, "
            "`load_dataset(..., streaming=False)`, or `Dataset.from_list(list(stream.take(n)))`.")


def label_columns(dataset: datasets.Dataset, label_names: Optional[Iterable[str]]) -> List[str]:
    return [c for c in dict.fromkeys([*(label_names or []), *LABEL_COLUMNS]) if c in dataset.column_names]


def _num_labels(model) -> Optional[int]:
    """The number of classes the model declares (``config.num_labels``, i.e. ``len(config.id2label)``), for any
    model whose output is that label space, whatever its class is called. Not checked (their config also says
    num_labels=2 by default): a model with an output embedding (a causal or masked LM, a seq2seq model) predicts
    tokens, so a class column there is e.g. the category an SFT dataset is split by; a headless model (BertModel,
    CLIPModel: its base model is itself) has no label space, its class column only feeds the split; a
    multiple-choice model's labels index the choices of each row. Regression and multi-label heads take floats.
    A user's own module whose ``config`` (not a transformers ``PretrainedConfig``, whose num_labels defaults to 2
    for every model) declares an integer ``num_labels`` is held to it."""
    from peft import PeftModel
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.models.auto.modeling_auto import MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES

    base = model.get_base_model() if isinstance(model, PeftModel) else model
    own_config = getattr(base, "config", None)  # a user's module may carry a config of its own
    if not isinstance(base, PreTrainedModel) and not isinstance(own_config, PretrainedConfig):
        declared = getattr(own_config, "num_labels", None)
        return declared if type(declared) is int and declared > 1 else None
    if not isinstance(base, PreTrainedModel) or base.get_output_embeddings() is not None or base.base_model is base:
        return None  # a plain module or a headless model declares no label space; a token predictor's are token ids
    if type(base).__name__ in MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES.values():
        return None  # labels index each row's choices
    config = base.config
    if config.problem_type in ("regression", "multi_label_classification") or not config.num_labels:
        return None
    return config.num_labels if config.num_labels > 1 else None


def _check_label_values(dataset: datasets.Dataset, column: str, name: str, num_labels: Optional[int]) -> None:
    feature = dataset.features[column]
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string"):
        raise ValueError(f"`{name}` column {column!r} holds strings; models need integer class ids: "
                         f"`{name} = {name}.class_encode_column({column!r})` (and pass its names as the model's "
                         "id2label/label2id).")
    scalar_int = isinstance(feature, datasets.ClassLabel) or (
        isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint")))
    values = dataset[column]
    if any(v is None for v in values):
        raise ValueError(f"`{name}` column {column!r} has missing (None) values: drop those rows, e.g. "
                         f"`{name}.filter(lambda row: row[{column!r}] is not None)`.")
    if not scalar_int or num_labels is None:
        return
    bad = sorted({int(v) for v in values if not (0 <= v < num_labels or v == -100)})
    if bad:
        raise ValueError(f"`{name}` column {column!r} has labels {bad[:5]} outside [0, {num_labels}) for a model with "
                         f"num_labels={num_labels}: load the model with num_labels (and id2label) matching the data, "
                         "e.g. from_pretrained(..., num_labels=dataset.features['label'].num_classes).")


def check_partition_column(dataset: datasets.Dataset, column: str) -> None:
    if column in dataset.column_names and any(v is None for v in dataset[column]):
        raise ValueError(f"`partition_column`={column!r} has missing (None) values: drop or fill those rows "
                         f"(`dataset.filter(lambda row: row[{column!r}] is not None)`), or use partition='iid'.")


def check_model_inputs(dataset: datasets.Dataset, name: str, signature_columns: Optional[List[str]],
                       labels: List[str]) -> None:
    """With ``remove_unused_columns`` (Trainer's default), only the columns the model's forward takes reach it:
    if none of them is in the data (raw text, raw images), the collator or forward fails later."""
    if not signature_columns:
        return
    inputs = [c for c in dataset.column_names if c in signature_columns and c not in labels]
    if not inputs:
        wanted = [c for c in signature_columns if c not in labels and c not in ("label", "label_ids")][:4]
        raise ValueError(
            f"`{name}` has no column the model takes (columns: {dataset.column_names}; the model's forward takes "
            f"{wanted}, ...). Tokenise or process it first, e.g. `{name}.map(lambda b: tokenizer(b['text'], "
            "truncation=True), batched=True)` for text or an image processor for pixel_values; or set "
            "remove_unused_columns=False with a collator that does it.")


def check_datasets(model, args, train_dataset, eval_dataset, compute_metrics, signature_columns) -> None:
    """Everything above for the training set, and the eval set's labels when ``compute_metrics`` needs them."""
    num_labels = _num_labels(model)
    if isinstance(train_dataset, datasets.Dataset):
        labels = label_columns(train_dataset, args.label_names)
        for column in labels:
            _check_label_values(train_dataset, column, "train_dataset", num_labels)
        if args.partition != "iid":
            check_partition_column(train_dataset, args.partition_column)
        if args.remove_unused_columns:
            check_model_inputs(train_dataset, "train_dataset", signature_columns, labels)
    evals = eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}
    for key, data in evals.items():
        if not isinstance(data, datasets.Dataset):
            continue
        name = f"eval_dataset[{key!r}]" if key else "eval_dataset"
        labels = label_columns(data, args.label_names)
        if compute_metrics is not None and not labels and not args.prediction_loss_only:
            raise ValueError(f"`{name}` has no label column (columns: {data.column_names}), so `compute_metrics` "
                             "would never run: add the labels (a 'label' column), or pass compute_metrics=None.")
        for column in labels:
            _check_label_values(data, column, name, num_labels)


def check_evaluation_set(args, eval_dataset, callbacks) -> None:
    """Settings that act on evaluation results, refused when there is no ``eval_dataset`` to evaluate: without one
    the round loop never evaluates, so they would silently do nothing (the best round is never picked, early
    stopping never triggers, round 0 is never scored)."""
    if eval_dataset is not None:
        return
    from transformers import EarlyStoppingCallback

    from ..metrics.direction import is_personal
    from ..metrics.generation import GenerationEvalCallback

    personal = is_personal(args.metric_for_best_model or "")  # evaluated on the clients' held-out rows instead
    needs = [f"`{name}`" for name, wanted in (
        ("load_best_model_at_end=True", args.load_best_model_at_end and not personal),
        (f"metric_for_best_model={args.metric_for_best_model!r}", args.metric_for_best_model is not None
         and not personal),
        (f"eval_strategy={args.eval_strategy_given!r}", args.eval_strategy_given in ("steps", "epoch")),
        ("eval_on_start=True", args.eval_on_start and not args.personalized_eval)) if wanted]
    needs += [f"the callback {type(c).__name__}" for c in callbacks
              if isinstance(c, (EarlyStoppingCallback, GenerationEvalCallback))]
    if needs:
        raise ValueError(f"No `eval_dataset` was given, so the run never evaluates, but these act on evaluation "
                         f"results: {', '.join(needs)}. Pass `eval_dataset=` (e.g. a held-out split of your data), "
                         "or remove them.")
