"""The oracles a pair of features is checked with. Each returns None when the invariant holds, else why not.

* :func:`equal`: the run equals its neutral twin's to ``atol + rtol |twin|`` per entry, trainable tensors and the
  history keys both runs have (features.HISTORY_KEYS; a twin that changes the encoding sent, ``wire``, skips the
  byte counts and the simulated times that follow from them).
* :data:`PROPERTIES`: statistical properties. ``dropout_masks``: each forward drops about half the entries (LoRA
  dropout 0.5), no two consecutive forwards of one shape share a mask, and under a launch the processes' row shards
  do not share one (independent masks agree on about half the entries; 0.8 is far outside chance at these sizes).
  ``fedbuff_times``: on identical devices and equal rows every client's round takes the same time T, so every
  server update of FedBuff happens at a whole multiple of T (T: the first update's time).
* :func:`trains`: finite loss in every round and the model moved (the weakest; only where nothing else applies).
* :func:`refusal_ok`: a refusal raised by fedhf itself (not a library) before any work, with the fix named.
"""

from __future__ import annotations

import math
import os
import traceback
from typing import List, Optional

import torch

from .features import HISTORY_KEYS

FIX_WORDS = ("set ", "use ", "leave ", "launch ", "turn ", "change ", "lower ", "raise ", "apply ", "choose ",
             "drop ", "unset ", "remove ", "run ")
AGREEMENT_LIMIT = 0.8
DROP_RATE = (0.4, 0.6)


def equal(run, twin, rtol: float, atol: float, initial: bool = False, wire: bool = False) -> Optional[str]:
    reference = twin.initial if initial else twin.state
    if set(run.state) - set(reference) or not run.state:
        return f"other trainable tensors than the twin's: {sorted(set(run.state) ^ set(reference))[:3]}"
    worst, where = 0.0, ""
    for name, got in run.state.items():
        value = reference[name]
        excess = float(((got.double() - value.double()).abs() - rtol * value.double().abs()).max())
        if excess > worst:
            worst, where = excess, name
    if worst > atol:
        return f"tensors differ by {worst + 0:.3g} beyond rtol {rtol:g} (entry {where}; atol {atol:g})"
    if initial:
        return None
    for index, (a, b) in enumerate(zip(run.history, twin.history)):
        for key in HISTORY_KEYS if not wire else [k for k in HISTORY_KEYS if not k.endswith("_MB") and not
                                                   k.startswith("sim_")]:
            if key in a and key in b and abs(float(a[key]) - float(b[key])) > max(atol, 1e-9) + max(rtol, 1e-7) * abs(
                    float(b[key])):
                return f"history {key} of round {index + 1}: {a[key]} against the twin's {b[key]}"
    if len(run.history) != len(twin.history):
        return f"{len(run.history)} rounds against the twin's {len(twin.history)}"
    return None


def _agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """The fraction of entries both masks saw (not 2: a zero input) on which they agree."""
    seen = (a != 2) & (b != 2)
    return float((a[seen] == b[seen]).float().mean()) if bool(seen.any()) else 0.0


def dropout_masks(run, twin=None) -> Optional[str]:
    if not run.masks:
        return "no dropout forward recorded"
    entries = torch.cat([m.flatten() for m in run.masks])
    rate = float((entries[entries != 2] == 1).float().mean())
    if not DROP_RATE[0] <= rate <= DROP_RATE[1]:
        return f"drop rate {rate:.3f} outside {DROP_RATE}"
    steps = [_agreement(a, b) for a, b in zip(run.masks, run.masks[1:]) if a.shape == b.shape]
    if steps and max(steps) > AGREEMENT_LIMIT:
        return f"consecutive forwards share a dropout mask (agreement {max(steps):.3f} > {AGREEMENT_LIMIT})"
    if len(run.shard_masks) > 1:
        shards = [_agreement(a, b) for a, b in zip(*run.shard_masks[:2]) if a.shape == b.shape]
        if shards and max(shards) > AGREEMENT_LIMIT:
            return f"the processes' row shards share a dropout mask (agreement {max(shards):.3f})"
    return None


def fedbuff_times(run, twin=None) -> Optional[str]:
    times = [float(e["sim_time_s"]) for e in run.history if "sim_time_s" in e]
    if not times or times[0] <= 0:
        return "no simulated time in the history"
    period = times[0]
    off = [t / period for t in times if abs(t / period - round(t / period)) > 1e-6]
    return f"updates at {off[0]:.4f} T, not a whole multiple of one client's round T = {period:.4f} s" if off else None


PROPERTIES = {"dropout_masks": dropout_masks, "fedbuff_times": fedbuff_times}


def trains(run, twin=None) -> Optional[str]:
    """Under DP or secure aggregation the loss is withheld (NaN in every round); it must not be infinite."""
    losses = [float(e["train_loss"]) for e in run.history if "train_loss" in e]
    withheld = run.private and all(math.isnan(v) for v in losses)
    if not losses or not (withheld or all(math.isfinite(v) for v in losses)):
        return f"train_loss not finite in every round: {losses}"
    moved = max(float((run.state[n] - run.initial[n]).abs().max()) for n in run.state)
    return None if moved > 0 else "the model did not move"


def refusal_ok(error: BaseException) -> Optional[str]:
    """None when fedhf raised it (its deepest frame in the fedhf package) and the message names a fix."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames: List = traceback.extract_tb(error.__traceback__)
    if not frames or not frames[-1].filename.startswith(root):
        where = frames[-1].filename if frames else "?"
        return f"refused by {os.path.relpath(where, os.path.dirname(root))}, not by fedhf: {error}"
    text = str(error).lower()
    if not any(word in text for word in FIX_WORDS):
        return f"the refusal names no fix: {error}"
    return None
