"""The model card written beside every saved model (``save_model()``, each round checkpoint's model/, and
``create_model_card()``/``push_to_hub()``), its federated section, and the Hub checks and upload.

Model cards follow huggingface_hub's ``ModelCard`` format: YAML metadata (``base_model`` by its Hub id, ``tags``,
``library_name``) then Markdown. peft's ``save_pretrained`` writes its own card with ``base_model`` set to the path
the base was loaded from, often an absolute local path; ours replaces it and never names a local path. The card
says what the folder holds (a peft adapter, with ``library_name: peft`` as peft writes it; or full weights, merged
when the server rule changed the base weights) and how to load it, and its eval rows are the saved round's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional

import torch
import yaml

from ..data.bundled_gemma import bundled_origin
from ..metrics.history import is_quality_metric, write_json_atomic
from ..state.checkpoint import PREFIX
from .card_code import adapter_code, bundled_base_name
from .card_details import CardDetails, with_details
from .config.config_checks import hub_is_offline
from .config.privacy_settings import dp_on, privacy_card_rows

FEDERATED_TAGS = ["fedhf", "federated-learning"]


@dataclass(frozen=True)
class SavedModel:
    """What a saved folder holds, for its card: ``kind`` is 'adapter' (a peft adapter for the base model),
    'merged' (full weights: the base, changed by a rule that folds into it, with the adapter merged) or 'full'
    (full weights of a model trained without peft); ``model_class`` the transformers class to load it with;
    ``lora`` the adapter's settings (r, alpha, rsLoRA, target modules), if any; ``round`` the round it is from;
    ``base`` the base model's Hub id (None: loaded from a local folder) and ``base_kwargs`` what its
    ``from_pretrained`` needs to match the adapter (a classifier's ``num_labels`` and label names, the base's dtype);
    ``quantization`` a bitsandbytes base's ``BitsAndBytesConfig`` arguments (those not at their defaults);
    ``bundled`` the bundled name of the base (its load code then calls fedhf's path helper)."""

    kind: str
    model_class: str
    lora: Optional[dict] = None
    round: Optional[int] = None
    base: Optional[str] = None
    base_kwargs: Optional[dict] = None
    bundled: Optional[str] = None  # the bundled name of the base's folder (fedhf/trainer/card_code.py), if any
    quantization: Optional[dict] = None


def saved_model(model, folded: bool, round_index: Optional[int]) -> SavedModel:
    """The description of what ``save_model`` writes for ``model`` (``folded``: the server rule folds into the
    base, so the merged model is written, see :meth:`fedhf.trainer.FederatedTrainer.published_model`)."""
    from peft import LoraConfig, PeftModel

    if not isinstance(model, PeftModel):
        return SavedModel("full", type(model).__name__, None, round_index)
    config = next(iter(model.peft_config.values()))
    lora = None
    if isinstance(config, LoraConfig):  # other peft methods (prompt tuning, ...) have no r / alpha
        targets = config.target_modules
        lora = {"r": config.r, "alpha": config.lora_alpha, "rslora": bool(config.use_rslora),
                "targets": sorted(targets) if isinstance(targets, (set, list, tuple)) else targets}
    return SavedModel("merged" if folded else "adapter", type(model.get_base_model()).__name__, lora, round_index,
                      hub_base_model(model), {**_head_kwargs(model.get_base_model()),
                                              **_dtype_kwargs(model.get_base_model())},
                      bundled_base_name(_base_name(model)), bitsandbytes_arguments(model.get_base_model()))


def _head_kwargs(model) -> dict:
    """A classifier's head size (and its label names when they are not transformers' LABEL_i defaults): without
    them ``from_pretrained`` builds a 2-label head that the adapter's saved head does not fit."""
    config = model.config
    if "Classification" not in type(model).__name__ or not getattr(config, "id2label", None):
        return {}
    labels = {int(i): name for i, name in config.id2label.items()}
    kwargs = {"num_labels": len(labels)}
    if any(name != f"LABEL_{i}" for i, name in labels.items()):
        kwargs["id2label"] = labels
    return kwargs


BNB_QUANTIZED_PARAMS = ("Params4bit", "Int8Params")  # bitsandbytes' quantized weights


def _dtype_kwargs(model) -> dict:
    """The frozen base's dtype, float32 included: ``from_pretrained`` loads a checkpoint in its stored dtype by
    default (transformers 5: dtype="auto"), so a base stored in bfloat16 but trained in float32 (or the reverse)
    would compute other logits than the evaluated ones. A bitsandbytes base, which the card quantizes again from
    the checkpoint, gets the dtype of its weights that are not quantized (norms, embeddings, head: quantized ones may
    be stored as floats, ``bnb_4bit_quant_storage``); a base of another quantization method, or frozen weights of
    several dtypes, are left to the checkpoint's own description."""
    quantization = model.config.to_dict().get("quantization_config")
    if quantization is not None and quantization.get("quant_method") != "bitsandbytes":
        return {}
    frozen = {p.dtype for p in model.parameters()
              if not p.requires_grad and p.is_floating_point() and type(p).__name__ not in BNB_QUANTIZED_PARAMS}
    return {"dtype": str(frozen.pop()).removeprefix("torch.")} if len(frozen) == 1 else {}


def bitsandbytes_arguments(model) -> Optional[dict]:
    """A bitsandbytes-quantized base's ``BitsAndBytesConfig`` arguments that differ from their defaults, so the card
    loads the base as quantized as it was trained (other quantization methods describe themselves in the checkpoint
    the base is loaded from). None for any other base."""
    config = model.config.to_dict().get("quantization_config")
    if not config or config.get("quant_method") != "bitsandbytes":
        return None
    from transformers import BitsAndBytesConfig

    return {k: v for k, v in BitsAndBytesConfig.from_dict(config).to_diff_dict().items() if not k.startswith("_")}


def _megabytes(value: float) -> str:
    """Enough digits that a small LoRA run does not read 0.0 MB."""
    return f"{value:,.1f}" if value >= 10 else f"{value:.4f}"


def _saved_entry(history: List[dict], round_index: Optional[int]) -> Optional[dict]:
    """The history entry of the saved round (the last one when none is named)."""
    if round_index is None:
        return history[-1] if history else None
    return next((e for e in history if e.get("round") == round_index), None)


def _rounds_row(args, history: List[dict]) -> str:
    """The rounds the model was trained for: those run (a run a budget stopped, or a round checkpoint's model, ran
    fewer than ``num_rounds``), with the plan and, for the simulated clock's budget, why it stopped."""
    ran = history[-1]["round"] if history else 0
    if ran >= args.num_rounds:
        return str(ran)
    last = history[-1] if history else {}
    seconds = last.get("sim_time_s")
    if args.clock_budget_s is not None and seconds is not None and seconds >= args.clock_budget_s:
        why = f"; stopped by `clock_budget_s`={args.clock_budget_s:g}, reached at {seconds:.6g} simulated seconds"
    elif args.dp_stop_at_budget and args.dp_epsilon is not None and "dp_epsilon" in last:
        why = (f"; stopped by `dp_stop_at_budget`: the next round would spend more than `dp_epsilon`="
               f"{args.dp_epsilon:g}, {last['dp_epsilon']:.4g} spent")
    else:
        why = ""
    return f"{ran} (of {args.num_rounds} planned{why})"


def _sharing_row(args) -> str:
    preset = args.parameter_sharing
    personal = args.parameter_sharing_kwargs.get("personal") if args.parameter_sharing_kwargs else None
    if preset in ("all", "ffa", "rolora") and not personal:
        return f"| parameter sharing | {preset} (every trained tensor is global) |"
    return (f"| parameter sharing | {preset}" + (f", kwargs {args.parameter_sharing_kwargs}"
                                                   if args.parameter_sharing_kwargs else "")
            + " (personal tensors: the saved ones are the clients' weighted mean; each client's own are in its "
            "client state) |")


def federated_card_section(args, algorithm, partition_summary: dict, history: List[dict],
                           saved: Optional[SavedModel] = None, processes: Optional[str] = None) -> str:
    sizes = partition_summary.get("sizes", [])
    lines = [
        "",
        "## Federated training (fedhf)",
        "",
        f"Trained with fedhf `FederatedTrainer`: **{algorithm.name}** "
        f"({algorithm.describe()}).",
        "",
        "| setting | value |",
        "|---|---|",
        f"| clients (N) | {args.num_clients} |",
        f"| clients per round (S) | {args.clients_per_round} |",
        f"| rounds (R) | {_rounds_row(args, history)} |",
        f"| local steps per round (K) | {args.local_steps} |",
        f"| local optimizer / state sync / correction / server rule | {algorithm.local_optimizer.cls.__name__} / "
        f"{algorithm.state_sync!r} / {algorithm.correction!r} / {algorithm.server_rule!r} |",
        f"| local batch size x gradient accumulation steps | {args.per_device_train_batch_size} x "
        f"{args.gradient_accumulation_steps} |",
        f"| seed | {args.seed} |",
        f"| processes | {processes or args.world_size} |",
        f"| fedhf version | {_version()} |",
        f"| learning rate schedule over rounds | {args.round_lr_schedule}, peak {algorithm.local_optimizer.lr} |",
        f"| partition | {args.partition}" + (f" (alpha={args.dirichlet_alpha}, key "
                                             f"{partition_summary.get('key', args.partition_column)})"
                                             if args.partition == "dirichlet" else "")
        + (f", power-law sizes (exponent {args.quantity_skew})" if args.quantity_skew else "")
        + (f", {args.client_eval_fraction:g} of each client's rows held out" if args.client_eval_fraction else "")
        + " |",
        _sharing_row(args),
        f"| base weights | " + ("changed every round: the server rule folds the clients' mean LoRA product into "
                               "them (W += s R) |" if algorithm.server_rule.folds_into_base else "frozen |"),
    ]
    if saved is not None and saved.lora is not None:
        lora = saved.lora
        lines.append(f"| LoRA | r={lora['r']}, alpha={lora['alpha']}, rsLoRA={lora['rslora']}, target modules "
                     f"{lora['targets']} |")
    if args.lora_client_ranks:
        lines.append(f"| LoRA client ranks | {list(args.lora_client_ranks)} |")
    released = not dp_on(args)  # per-client sizes and label skew are client data the DP accountant does not cover
    if sizes and released:
        lines.append(f"| rows per client (min / max) | {min(sizes)} / {max(sizes)} |")
    if "label_skew" in partition_summary and released:
        lines.append(f"| label skew (mean TV distance to the global mix) | {partition_summary['label_skew']:.3f} |")
    lines.extend(privacy_card_rows(args, history))  # the DP guarantee (docs/privacy.md)
    entry = _saved_entry(history, saved.round if saved is not None else None)
    if history:
        lines.append(f"| communicated (up + down) | {_megabytes(history[-1].get('communicated_MB', 0.0))} MB |")
    if entry is not None:
        evals = {k: v for k, v in entry.items() if (is_quality_metric(k) or k == "eval_loss") and isinstance(v, float)}
        for key, value in sorted(evals.items()):
            lines.append(f"| final {key} (saved model, round {entry.get('round')}) | {value:.4f} |")
    return "\n".join(lines) + "\n" + (_how_to_load(saved) if saved is not None else "")


def _how_to_load(saved: SavedModel) -> str:
    if saved.kind == "adapter":
        what = ("This folder is a **peft LoRA adapter**; load it onto the base it was trained from:\n\n```python\n"
                + adapter_code(saved.model_class, saved.base, saved.bundled, saved.base_kwargs or {},
                                 saved.quantization) + "```\n")
    else:
        kind = ("the **full model**: the base weights as the server rule changed them, with the final LoRA adapter "
                "merged in (W + s B A, peft's `merge_and_unload`); it is not an adapter, and it needs no base model"
                if saved.kind == "merged" else "the **full model weights**")
        what = (f"This folder holds {kind}:\n\n```python\nfrom transformers import {saved.model_class}\n\n"
                f"model = {saved.model_class}.from_pretrained(PATH_OR_REPO_ID)\n```\n")
    return "\n### What the upload contains\n\n" + what


def _version() -> str:
    from ..version import __version__

    return __version__


def _base_name(model) -> Optional[str]:
    """For a peft model, the adapter's ``base_model_name_or_path``; otherwise the config's ``_name_or_path``."""
    peft_config = getattr(model, "peft_config", None)  # peft models only
    if isinstance(peft_config, dict) and peft_config:
        return next(iter(peft_config.values())).base_model_name_or_path
    config = getattr(model, "config", None)
    return getattr(config, "_name_or_path", None) if config is not None else None


def hub_base_model(model) -> Optional[str]:
    """The base model's Hub id, or None when it was loaded from a local folder (a path is never published), except
    a bundled model's cache folder, which names the Hub model it was built from (fedhf/data/bundled_gemma.py)."""
    name, origin = _base_name(model), _bundled_origin(model)
    if origin:
        return origin["base_model"]
    if not name or os.path.isabs(name) or os.path.exists(name) or name.startswith((".", "~")):
        return None
    return name


def base_model_license(model) -> Optional[str]:
    """The base model's license when fedhf knows it (a bundled model's), for the card's ``license``."""
    origin = _bundled_origin(model)
    return origin["license"] if origin else None


def _bundled_origin(model) -> Optional[dict]:
    name = _base_name(model)
    return bundled_origin(name) if name and os.path.isdir(name) else None


def model_card(args, algorithm, partition_summary: dict, history: List[dict], base_model: Optional[str],
               saved: Optional[SavedModel] = None, license: Optional[str] = None,
               origin_note: str = "", details: CardDetails = CardDetails(), processes: Optional[str] = None) -> str:
    """The whole card: metadata (``library_name: peft`` for an adapter, as peft writes it: it drives the Hub's
    loading snippet; the user's ``create_model_card`` details: fedhf/trainer/card_details.py), a title (their
    ``model_name``, else the output folder's name), what the base weights were (``origin_note``: a bundled model's,
    with its terms' notice) and the federated section."""
    library = "peft" if saved is not None and saved.kind == "adapter" else "transformers"
    metadata = {"library_name": library, "tags": list(FEDERATED_TAGS) + [algorithm.name]}
    if base_model:
        metadata["base_model"] = base_model
    if license:  # the base model's terms apply to what is trained from it
        metadata["license"] = license
    metadata = with_details(metadata, details)
    base_model = metadata.get("base_model")
    title = f"# {details.title or os.path.basename(os.path.normpath(args.output_dir))}"
    origin = (f"a fine-tuned version of [{base_model}](https://huggingface.co/{base_model})" if base_model
              else "a fine-tuned model (its base model was loaded from a local folder)")
    intro = f"This model is {origin}, trained federatedly over {args.num_clients} simulated clients with fedhf."
    intro += f"\n\n{origin_note}\n" if origin_note else ""
    return ("---\n" + yaml.safe_dump(metadata, sort_keys=True) + "---\n\n" + title + "\n\n" + intro + "\n"
            + federated_card_section(args, algorithm, partition_summary, history, saved, processes))


def write_model_card(directory: str, args, algorithm, partition_summary: dict, history: List[dict], model,
                     saved: Optional[SavedModel] = None, details: CardDetails = CardDetails(),
                     processes: Optional[str] = None) -> str:
    """Write ``directory``/README.md (replacing peft's or Trainer's); returns its path."""
    path = os.path.join(directory, "README.md")
    origin = _bundled_origin(model)
    with open(path, "w") as f:
        f.write(model_card(args, algorithm, partition_summary, history, hub_base_model(model), saved,
                           base_model_license(model), origin["card_note"] if origin else "", details, processes))
    if origin:
        publish_bundled_base(directory, origin)
    return path


def publish_bundled_base(directory: str, origin: dict) -> None:
    """Beside a model trained from a bundled base: the adapter's ``base_model_name_or_path`` is the Hub id the card
    names (peft writes the local cache folder: a path is never published, and others could not load it), and the
    base's terms' NOTICE file (the Gemma Terms of Use, section 3.1, ask for one with every Model Derivative)."""
    adapter_config = os.path.join(directory, "adapter_config.json")
    if os.path.isfile(adapter_config):
        with open(adapter_config) as f:
            config = json.load(f)
        if config.get("base_model_name_or_path") != origin["base_model"]:
            config["base_model_name_or_path"] = origin["base_model"]
            write_json_atomic(config, adapter_config)
    with open(os.path.join(directory, "NOTICE"), "w") as f:
        f.write(origin["notice"])


def offline_push_message(folder: str, repo_id: Optional[str]) -> str:
    """push_to_hub() called offline after training: what was saved, and how to upload it later."""
    return (f"push_to_hub(): the Hub is offline (HF_HUB_OFFLINE is set), so nothing was uploaded. The model and its "
            f"card are saved in {folder}; upload them when online with `hf upload {repo_id or 'YOU/NAME'} {folder} "
            "--exclude '*.bin' --exclude 'checkpoint-*' --exclude 'client_state/*'` (docs/configuration.md, \"Publish later\"), or unset HF_HUB_OFFLINE "
            "and call push_to_hub() again.")


# never uploaded: pickles (training_args.bin and the like) and the clients' spilled state (their optimizer and
# correction states: per-client data the published model does not need)
UNPUBLISHED = ("*.bin", "*.pt", "*.pth", "*.pkl", "client_state/*")


def upload_operations(folder: str, path_in_repo: str = "") -> list:
    """One ``CommitOperationAdd`` per file under ``folder`` (sorted), under ``path_in_repo``. Pickle files
    (training_args.bin and the like) are never published."""
    from huggingface_hub import CommitOperationAdd

    operations = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(tuple(pattern[1:] for pattern in UNPUBLISHED)):
                continue
            relative = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            operations.append(CommitOperationAdd(path_in_repo=f"{path_in_repo}/{relative}" if path_in_repo else relative,
                                                 path_or_fileobj=os.path.join(root, name)))
    return operations


def push_round_checkpoint(args, repo_id: str, model_dir: str, round_index: int):
    """A round checkpoint's model (weights/adapter + card) to the Hub through ``HfApi.create_commit``, as
    ``hub_strategy`` says: 'end' pushes nothing here (push_to_hub() at the end does), 'every_save'/'checkpoint'
    replace the repository's model with this round's, 'all_checkpoints' adds it under checkpoint-N/."""
    from huggingface_hub import HfApi

    strategy = str(getattr(args.hub_strategy, "value", args.hub_strategy))
    if strategy == "end":
        return None
    prefix = f"{PREFIX}{round_index}" if strategy == "all_checkpoints" else ""
    return HfApi(token=args.hub_token).create_commit(
        repo_id=repo_id, operations=upload_operations(model_dir, prefix), revision=args.hub_revision,
        commit_message=f"fedhf: global model after round {round_index}")
