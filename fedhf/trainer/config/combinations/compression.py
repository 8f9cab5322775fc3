"""Refused combinations of communication compression (fedhf/compression/, docs/compression.md): server rules that
read something formed from a client's *exact* model change, and a downlink the clients would train from
approximately."""

from __future__ import annotations

from typing import List

from ....compression import parse_plan
from ....compression.plan import compressed_model_change
from ....sharing.alternating import ROLORA
from .refusal import Refusal, Setup


def _compressed_delta(s: Setup, linear_ok: bool = False) -> List[str]:
    """The shared tensors whose model change (``dx``) the uplink compresses (non-linear compressors only, when
    ``linear_ok``: a linear one's sum of encodings decodes to the sum, which a sum-reading rule can take)."""
    picked = compressed_model_change(parse_plan(s.args.uplink_compression), s.shared)
    return [name for name, compressor in picked.items() if not (linear_ok and compressor.linear)]


def _compressed_text(s: Setup, why: str, fix: str, linear_ok: bool = False) -> str:
    names = _compressed_delta(s, linear_ok)
    shown = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
    return (f"`uplink_compression={s.args.uplink_compression!r}` compresses the model change of {shown}, but "
            f"{why}; {fix}")


_COMPRESS_OTHERS = "compress only other tensors (e.g. 'correction.*=int8,sync.*=bf16') or"

ROWS: List[Refusal] = [
    Refusal(lambda s: s.needs_lora_pairs and bool(_compressed_delta(s, linear_ok=True)),
            lambda s: _compressed_text(s, f"`server_rule={s.rule.name!r}` aggregates the products B_i A_i of each "
                                          "client's exact factors, and a non-linear compressor (per-client scales, "
                                          "supports or bases) does not keep them",
                                       f"{_COMPRESS_OTHERS} use a server_rule that averages A and B (mean)",
                                       linear_ok=True)),
    Refusal(lambda s: s.rule.aggregator.gathers and bool(_compressed_delta(s)),
            lambda s: _compressed_text(s, f"the robust `server_rule={s.rule.name!r}` gathers each client's "
                                          "uncompressed update", f"{_COMPRESS_OTHERS} use a mean-based server_rule")),
    Refusal(lambda s: s.rule.aggregator.needs_preconditioners and bool(_compressed_delta(s)),
            lambda s: _compressed_text(s, f"`server_rule={s.rule.name!r}` mixes Delta_i P_i formed from each "
                                          "client's exact change", f"{_COMPRESS_OTHERS} use another server_rule")),
    Refusal(lambda s: (s.sharing.preset == ROLORA or s.rule.aggregator.freezes_lora_a) and bool(_compressed_delta(s)),
            lambda s: _compressed_text(s, "a LoRA factor frozen on the clients (`parameter_sharing='rolora'`, "
                                          "`server_rule='fedsvd'`) makes the change a declared-size message that a "
                                          "compressor would skip", f"{_COMPRESS_OTHERS} use parameter_sharing='all'")),
    Refusal(lambda s: parse_plan(s.args.downlink_compression).active
            and (s.needs_lora_pairs or s.rule.aggregator.folds_into_base),
            lambda s: f"`downlink_compression={s.args.downlink_compression!r}` has the clients train from an "
                      f"approximate model, but `server_rule={s.rule.name!r}` forms its LoRA products and base "
                      "residual from the server's exact A and B",
            "leave downlink_compression='none' with it, or use a server_rule that averages A and B (mean)"),
]
