"""The compression fields of :class:`fedhf.FederatedConfig` (fedhf/compression/, docs/compression.md). A bad
spec is refused when the config is made (``parse_plan`` in ``FederatedConfig.__post_init__``); the round hook that
applies them is fedhf/trainer/hooks/compression.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...compression import COMPRESSORS
from .field_help import choice_list


@dataclass
class CompressionSettings:
    r"""
    Communication compression, a base of :class:`fedhf.FederatedConfig` (each parameter is its flag or recipe key).

    Parameters:
        uplink_compression (`str`, defaults to `"none"`): what each client's tensors are compressed with.
        downlink_compression (`str`, defaults to `"none"`): what the broadcast tensors are compressed with.
        error_feedback (`bool`, defaults to `True`): keep what compression dropped and send it later.
    """

    uplink_compression: str = field(
        default="none",
        metadata={"help": f"Compression of what each client sends: a compressor for every tensor (one of: "
                          f"{choice_list(COMPRESSORS.names())}; arguments int8:<block>, topk:<fraction>, "
                          "powersgd:<rank>) or "
                          "comma-separated `selector=compressor` rules, the first match winning, selectors a LoRA role "
                          "(lora_A, lora_B, head, norm) or a pattern on the message key (dx.*, correction.*, "
                          "sync.theta.*, server.*), e.g. 'lora_A=int8,lora_B=int4,correction.*=bf16'. The uplink "
                          "counts the encoded bytes (payload + indices + scales)."})
    downlink_compression: str = field(
        default="none",
        metadata={"help": "Compression of the broadcast (keys model.<param>, correction.<key>, sync.<key>), as "
                          "`uplink_compression`; the first broadcast is dense, then the compressed difference to the "
                          "model the clients hold (with error_feedback) or the compressed model (without)."})
    error_feedback: bool = field(
        default=True,
        metadata={"help": "With compression: keep what it dropped (per client in the client store for the uplink, "
                          "on the server for the downlink) and add it to the next message (EF-SGD/EF21). False "
                          "sends each message compressed on its own (unbiased with int8/int4/int2)."})
