"""Which compressor each sent tensor gets: a spec string parsed once into ordered (selector, compressor) rules.

Spec: comma-separated items ``[selector=]compressor[:arg]``; the first item whose selector matches a tensor's key
wins, and a tensor no item matches is sent as it is (``none``). A bare compressor selects everything.

Keys are the message keys as they enter the round's sums: the model change ``dx.<param>`` (and ``buf.<buffer>``),
a component's state ``correction.<key>``, ``sync.theta.<key>``, ``server.<key>``; on the downlink, the broadcast
``model.<param>``, ``correction.<key>``, ``sync.<key>``. A selector is

* a LoRA role (:func:`fedhf.core.lora.role_of`): ``lora_A``, ``lora_B``, ``head``, ``norm``;
* or an fnmatch pattern on the key (``correction.*``, ``dx.*``, ``*.lora_B.*``, ``sync.theta.*``).

Examples: ``"int8"``; ``"topk:0.01"``; ``"lora_A=int8,lora_B=int4,correction.*=bf16"``;
``"dx.*=powersgd:4,sync.*=bf16"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Dict, List, Optional, Tuple

from ..core.lora import ROLES, role_of
from .base import Compressor, build_compressor


@dataclass(frozen=True)
class CompressionPlan:
    rules: Tuple[Tuple[str, Compressor], ...] = ()

    def pick(self, key: str) -> Optional[Compressor]:
        """The compressor of a key (None: sent as it is)."""
        for selector, compressor in self.rules:
            if _matches(selector, key):
                return None if compressor.name == "none" else compressor
        return None

    @property
    def active(self) -> bool:
        return any(c.name != "none" for _, c in self.rules)

    def compressors(self) -> List[Compressor]:
        return [c for _, c in self.rules if c.name != "none"]

    def spec(self) -> str:
        return ",".join(f"{s}={c.spec()}" for s, c in self.rules) or "none"


def _matches(selector: str, key: str) -> bool:
    if selector in ROLES:
        return role_of(key) == selector
    return fnmatchcase(key, selector)


def parse_plan(spec: Optional[str], field_name: str = "uplink_compression") -> CompressionPlan:
    """The plan of a spec string; a bad spec raises ValueError naming the field and the item."""
    if spec is None or not str(spec).strip():
        return CompressionPlan()
    rules = []
    for item in str(spec).split(","):
        item = item.strip()
        selector, sep, compressor = item.partition("=")
        if not sep:
            selector, compressor = "*", item
        selector = selector.strip()
        if not selector or not compressor.strip():
            raise ValueError(f"`{field_name}`: {item!r} is not `[selector=]compressor[:arg]` "
                             f"(e.g. 'int8' or 'lora_A=int8,lora_B=int4').")
        try:
            rules.append((selector, build_compressor(compressor)))
        except ValueError as error:
            text = str(error).replace("`uplink_compression`", f"`{field_name}`")  # the registry names the uplink
            raise ValueError(text if f"`{field_name}`" in text else f"`{field_name}`: {text}") from None
    return CompressionPlan(tuple(rules))


def compressed_model_change(uplink: CompressionPlan, shared) -> Dict[str, Compressor]:
    """The shared tensors whose model change (message key ``dx.<name>``) ``uplink`` compresses, with their
    compressor (read by the round hook, the refusal table and the memory plan)."""
    picked = {name: uplink.pick(f"dx.{name}") for name in shared}  # a client's model change is sent as dx.<name>
    return {name: compressor for name, compressor in picked.items() if compressor is not None}
