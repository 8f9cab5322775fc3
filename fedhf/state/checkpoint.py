"""Checkpoints of a whole federated run: safetensors for tensors, JSON for everything else, a manifest of
SHA-256 checksums verified on load, and an atomic write (a temporary folder renamed into place) so a crash
never leaves a checkpoint that looks valid but is not. Nothing is ever unpickled.

Layout of ``checkpoint-N/`` (N = rounds done = ``state.global_step``, the name Trainer gives its checkpoints, so the
reporting integrations that upload ``output_dir/checkpoint-{global_step}`` find it)::

    <group>.safetensors ...   one file per tensor group (global model, server state, client store)
    meta.json                 round counter, metrics history, communicated bytes, config fingerprint, best round
    model/                    the global model as ``save_model`` writes it (adapter or full weights)
    manifest.json             {"format": 1, "files": {name: sha256}}  -- written last
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Callable, Dict, List, Optional, Tuple

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..core.params import TensorDict
from ..runtime.files import sha256_of

FORMAT = 1
MANIFEST = "manifest.json"
META = "meta.json"
PREFIX = PREFIX_CHECKPOINT_DIR + "-"  # "checkpoint-", as Trainer names its checkpoints
LEGACY_PREFIX = "checkpoint-round-"  # what earlier fedhf versions wrote; such runs still resume and rotate
_NAME = re.compile(re.escape(PREFIX) + r"(?:round-)?(\d+)")


class CheckpointError(ValueError):
    pass


def save_checkpoint(directory: str, groups: Dict[str, TensorDict], meta: dict,
                    write_extra: Optional[Callable[[str], None]] = None) -> str:
    """Write ``groups`` (name -> tensors), ``meta`` and whatever ``write_extra(tmp_dir)`` writes (e.g. the model
    via ``save_model``) to ``directory`` atomically; every file goes into the manifest. Returns the directory."""
    tmp = directory.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for group, tensors in groups.items():
        save_file({k: v.detach().contiguous() for k, v in tensors.items()}, os.path.join(tmp, f"{group}.safetensors"))
    with open(os.path.join(tmp, META), "w") as f:
        json.dump(meta, f)
    if write_extra is not None:
        write_extra(tmp)
    files = {}
    for root, _, names in os.walk(tmp):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), tmp)
            files[relative] = sha256_of(os.path.join(tmp, relative))
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump({"format": FORMAT, "files": files}, f, indent=1)
    if os.path.exists(directory):
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory


def load_checkpoint(directory: str, device: str = "cpu") -> Tuple[Dict[str, TensorDict], dict]:
    """Verify every checksum, then load the tensors onto ``device`` (the model's, where a run's state lives). Raises
    CheckpointError naming what is wrong and what to do."""
    fix = "Resume from an earlier checkpoint-N folder, or start the run again."
    manifest_path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise CheckpointError(f"{directory} is not a complete fedhf checkpoint (no {MANIFEST}). {fix}")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{manifest_path} is unreadable ({err}). {fix}") from None
    if manifest.get("format") != FORMAT or META not in files:
        raise CheckpointError(f"{manifest_path} is not a fedhf checkpoint manifest of format {FORMAT}. {fix}")
    for name, expected in files.items():
        path = os.path.join(directory, name)
        if os.path.isabs(name) or ".." in name.split(os.sep) or not os.path.isfile(path):
            raise CheckpointError(f"Checkpoint file {path} is missing. {fix}")
        if sha256_of(path) != expected:
            raise CheckpointError(f"Checkpoint file {path} is corrupted or truncated (checksum mismatch). {fix}")
    groups = {}
    for name in files:
        if name.endswith(".safetensors") and os.sep not in name:
            try:
                groups[name[: -len(".safetensors")]] = load_file(os.path.join(directory, name), device=str(device))
            except SafetensorError as err:
                raise CheckpointError(f"Checkpoint file {name} is not valid safetensors ({err}). {fix}") from None
    with open(os.path.join(directory, META)) as f:
        meta = json.load(f)
    return groups, meta


def round_folders(output_dir: str) -> List[Tuple[int, str]]:
    """(round, folder name) of every round checkpoint folder in ``output_dir``, under either name (``checkpoint-N``
    or the older ``checkpoint-round-N``), sorted by round, a ``checkpoint-N`` after an older name of the same round;
    temporary folders are ignored."""
    found = [(int(m.group(1)), name.startswith(LEGACY_PREFIX), name) for name in
             (os.listdir(output_dir) if os.path.isdir(output_dir) else []) if (m := _NAME.fullmatch(name))]
    return [(r, name) for r, _, name in sorted(found, key=lambda f: (f[0], not f[1]))]


def round_folder(output_dir: str, round_index: int) -> str:
    """The folder of round ``round_index``'s checkpoint: an existing one (either name), else the ``checkpoint-N`` a
    save writes."""
    existing = [name for r, name in round_folders(output_dir) if r == round_index]
    return os.path.join(output_dir, existing[-1] if existing else f"{PREFIX}{round_index}")


def latest_checkpoint(output_dir: str) -> Optional[str]:
    """The complete checkpoint with the highest round in ``output_dir`` (temporary folders are ignored)."""
    complete = [name for _, name in round_folders(output_dir)
                if os.path.isfile(os.path.join(output_dir, name, MANIFEST))]
    return os.path.join(output_dir, complete[-1]) if complete else None
