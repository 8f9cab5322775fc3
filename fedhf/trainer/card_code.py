"""The model card's load code: Python that loads exactly the model that was evaluated.

An adapter is only the model it was evaluated as when it sits on the same base weights. So the code names the
base the run was trained from:

- a bundled base (``bundled-gemma-3-270m``, ``bundled-minilm``): fedhf's own path helper, which rebuilds or finds
  the same local folder (the Gemma one is a Q4_K_M de-quantisation, so google's Hub weights are only a commented
  alternative: other weights than the evaluated ones);
- a Hub id: the id itself;
- any other local folder: a ``BASE_MODEL = "..."`` placeholder (a local path is never published);

and loads it as it was trained: in its dtype, and a bitsandbytes base quantized with the same ``BitsAndBytesConfig``.
"""

from __future__ import annotations

import os
from typing import Optional

from ..data import bundled_gemma

# bundled name -> (module, function) whose call returns the base's local folder
BUNDLED_BASES = {bundled_gemma.NAME: ("fedhf.data.bundled_gemma", "gemma_3_270m_path"),
                 "bundled-minilm": ("fedhf.data.demo", "minilm_path")}


def bundled_base_name(folder: Optional[str]) -> Optional[str]:
    """The bundled name of the folder a base was loaded from, or None: the Gemma cache carries fedhf's manifest;
    the MiniLM folder is the one its package installs."""
    if not folder or not os.path.isdir(folder):
        return None
    if bundled_gemma.bundled_origin(folder) is not None:
        return bundled_gemma.NAME
    try:
        from ..data.demo import minilm_path

        minilm = minilm_path()
    except ImportError:  # the demo extras are not installed: the folder cannot be theirs
        return None
    return "bundled-minilm" if os.path.realpath(folder) == os.path.realpath(minilm) else None


def base_lines(base: Optional[str], bundled: Optional[str]) -> str:
    """The lines that set ``BASE_MODEL``: a bundled base's helper (with the Hub id it came from, when known, as a
    commented alternative), a Hub id, or the placeholder of a local folder."""
    if bundled in BUNDLED_BASES:
        module, function = BUNDLED_BASES[bundled]
        lines = (f"from {module} import {function}\n\n"
                 f"BASE_MODEL = {function}()  # fedhf's `{bundled}`: the base this model was trained and evaluated "
                 "on\n")
        if base:
            lines += (f"# BASE_MODEL = {base!r}  # the Hub original: other weights than the evaluated ones "
                      "(the adapter loads, its answers may differ)\n")
        return lines
    if base:
        return f"BASE_MODEL = {base!r}\n"
    return 'BASE_MODEL = "..."  # the base model was loaded from a local folder: its path or Hub id\n'


def adapter_code(model_class: str, base: Optional[str], bundled: Optional[str], base_kwargs: dict,
                 quantization: Optional[dict] = None) -> str:
    """Python that loads the adapter onto its base (``PATH_OR_REPO_ID``: this folder, or its Hub repository), a
    bitsandbytes base quantized with the ``BitsAndBytesConfig`` arguments it was trained with."""
    arguments = ["BASE_MODEL"] + [f"{k}={v!r}" for k, v in base_kwargs.items()]
    imports = model_class
    if quantization is not None:
        imports += ", BitsAndBytesConfig"
        settings = ", ".join(f"{k}={v!r}" for k, v in quantization.items())
        arguments.append(f"quantization_config=BitsAndBytesConfig({settings})")
    arguments = ", ".join(arguments)
    return (f"from peft import PeftModel\nfrom transformers import {imports}\n"
            + ("" if bundled in BUNDLED_BASES else "\n") + base_lines(base, bundled)
            + f"base = {model_class}.from_pretrained({arguments})\n"
            "model = PeftModel.from_pretrained(base, PATH_OR_REPO_ID)  # this folder, or its Hub repository\n")
