"""Everything a federated run carries from one round to the next, and its checkpoint form.

Nothing else is needed to resume bit for bit: client sampling, data order, dropout and every other random
draw come from (seed, round, client) streams (:mod:`fedhf.core.schedule`); optimizer state that outlives a round is
either the broadcast Thetabar (``sync_state``) or per-client state in the client store. A round checkpoint also
holds the best round (fedhf/trainer/hooks/best_round.py) and, under fp16, the loss scaler's state (fedhf/trainer/runners/loss_scaling.py).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

from transformers.utils import logging

from ..core.params import TensorDict
from .checkpoint import LEGACY_PREFIX, PREFIX, latest_checkpoint, round_folders

logger = logging.get_logger(__name__)

#: Fields added after checkpoints were first written, with the value a checkpoint without them was written with.
ADDED_FIELDS = {"partition_key": "column", "partition_key_buckets": 4, "quantity_skew": 0.0,
                "client_eval_fraction": 0.0, "parameter_sharing": "all", "parameter_sharing_kwargs": None,
                "lora_client_ranks": None, "gradient_accumulation_steps": 1, "batched_clients": 1, "bf16": False,
                "fp16": False, "metric_for_best_model": None, "greater_is_better": None,
                "load_best_model_at_end": False, "uplink_compression": "none", "downlink_compression": "none",
                "error_feedback": True, "client_sampling": "fixed", "dp_mode": "off", "dp_clip_norm": None,
                "dp_epsilon": None, "dp_delta": None, "dp_noise_multiplier": None, "dp_accountant": "rdp",
                "dp_adaptive_clip_quantile": None, "secure_aggregation": False, "secagg_bits": 20,
                "secagg_range": None, "dp_min_survivors": None, "dp_reproducible_noise": False, "clock_profile": None,
                "clock_tokens_per_s": 2000.0, "clock_uplink_mbps": 5.0, "clock_downlink_mbps": 20.0,
                "clock_spread": 1.0, "clock_availability": 1.0, "round_policy": "wait_all", "round_deadline_s": None,
                "over_selection": 0.0}
#: Fields fingerprinted only after checkpoints were written with them set (the fingerprint was then a hand-kept list
#: that missed them): a checkpoint without one may hold any value, so it is not compared (the run resumes with the
#: value given now, as it did before they were fingerprinted), rather than refused at a default it may not have had.
UNRECORDED_FIELDS = ("async_concurrency", "dp_adaptive_clip_lr", "dp_adaptive_clip_count_std", "min_partition_size",
                     "partition_encoder", "max_update_norm")

GROUPS = ("global_params", "global_buffers", "server_state", "correction_state", "sync_state", "personal_init",
          "base_params", "compression_state")


@dataclass
class RunState:
    global_params: TensorDict
    global_buffers: TensorDict
    server_state: TensorDict
    correction_state: TensorDict
    sync_state: TensorDict = field(default_factory=dict)  # Thetabar of average_warmstart / compressed_average
    personal_init: TensorDict = field(default_factory=dict)  # personal tensors at the start (fedhf/sharing/plan.py)
    base_params: TensorDict = field(default_factory=dict)  # frozen base weights a server rule folds into (FedEx-LoRA)
    compression_state: TensorDict = field(default_factory=dict)  # downlink x_hat, PowerSGD Q (trainer/hooks/compression.py)
    rounds_done: int = 0
    uplink_bytes: float = 0.0
    downlink_bytes: float = 0.0
    losses: List[float] = field(default_factory=list)
    cohort: List[int] = field(default_factory=list)  # the current round's clients after selection (not checkpointed)
    # the clients that began the current round (secure aggregation's mask partners): the sampled ones, less those a
    # hook found offline before they started; a client here but not in ``cohort`` dropped after it began (the
    # clock's deadline), and its masks are removed by secure aggregation's recovery (not checkpointed)
    started: List[int] = field(default_factory=list)

    def tensor_groups(self) -> Dict[str, TensorDict]:
        return {name: getattr(self, name) for name in GROUPS}

    def close_round(self, sums, round_lr: float) -> dict:
        """Count a finished round from its sums (a fedhf.core.sums.RoundSums) and return its log entry."""
        total_weight = sums.scalar("w")
        self.rounds_done += 1
        self.uplink_bytes += sums.scalar("uplink_bytes")
        self.downlink_bytes += sums.scalar("downlink_bytes")
        self.losses.append(sums.scalar("loss") / total_weight if total_weight > 0 else float("nan"))
        return {"round": self.rounds_done, "train_loss": self.losses[-1], "learning_rate": round_lr,
                "participants": int(sums.scalar("n")), "excluded_clients": int(sums.scalar("excluded")),
                "uplink_MB": self.uplink_bytes / 2**20, "downlink_MB": self.downlink_bytes / 2**20,
                "communicated_MB": (self.uplink_bytes + self.downlink_bytes) / 2**20}

    def meta(self) -> dict:
        return {"rounds_done": self.rounds_done, "uplink_bytes": self.uplink_bytes,
                "downlink_bytes": self.downlink_bytes, "losses": self.losses}

    @classmethod
    def from_checkpoint(cls, groups: Dict[str, TensorDict], meta: dict) -> "RunState":
        return cls(**{name: groups.get(name, {}) for name in GROUPS}, rounds_done=meta["rounds_done"],
                   uplink_bytes=meta["uplink_bytes"], downlink_bytes=meta["downlink_bytes"],
                   losses=list(meta["losses"]))


def fingerprint(args, algorithm) -> dict:
    """The config fields a resumed run must match, as the config declares them (``args.fingerprint_fields()``:
    every settings group's field but those that may change on resume, fedhf/trainer/config/resume_fields.py), and
    the algorithm as built."""
    return {"algorithm": algorithm.describe(), **{name: getattr(args, name) for name in args.fingerprint_fields()}}


def check_fingerprint(path: str, meta: dict, expected: dict) -> None:
    recorded = meta.get("fingerprint", {})
    stored = {**ADDED_FIELDS, **{k: expected[k] for k in UNRECORDED_FIELDS if k in expected}, **recorded}
    mismatched = sorted(k for k in expected if stored.get(k) != expected[k])
    if mismatched:
        details = "; ".join(f"{k}: checkpoint {stored.get(k)!r}, now {expected[k]!r}" for k in mismatched)
        same = ", ".join(f"{k}={stored.get(k)!r}" for k in mismatched if k != "algorithm")
        raise ValueError(f"Checkpoint {path} was written by a different run ({details}). Resume with the same "
                         f"settings ({same or 'the same algorithm'}), or start a new run in another output_dir.")


def resolve_checkpoint(output_dir: str, resume_from_checkpoint: Union[str, bool, None]) -> Optional[str]:
    """The checkpoint folder to resume from: a path, or True for the latest complete one in ``output_dir``."""
    if not resume_from_checkpoint:
        return None
    if resume_from_checkpoint is True:
        path = latest_checkpoint(output_dir)
        if path is None:
            raise ValueError(f"`resume_from_checkpoint=True` but {output_dir} holds no complete {PREFIX}N (or "
                             f"older {LEGACY_PREFIX}N) folder; pass a path, or set `save_every_rounds` to write them.")
        return path
    if not os.path.isdir(resume_from_checkpoint):
        raise ValueError(f"`resume_from_checkpoint`={resume_from_checkpoint!r} is not a folder.")
    return resume_from_checkpoint


def refuse_to_overwrite(output_dir: str, overwrite: bool, history_file: str) -> None:
    """Nothing a user saved is replaced silently: a new run needs an output_dir without an earlier run. With
    ``overwrite`` the earlier run's checkpoint-N folders are deleted, and said so, before the new run writes its
    own: left in place, a later resume could pick the earlier run's newest checkpoint and mix the two runs."""
    checkpoint = latest_checkpoint(output_dir)
    if not (os.path.exists(os.path.join(output_dir, history_file)) or checkpoint is not None):
        return
    if not overwrite:
        resume = (f"Resume it from {checkpoint} with `train(resume_from_checkpoint=True)` (`fedhf train ... "
                  "--resume`), choose" if checkpoint else "It wrote no checkpoint to resume from. Choose")
        raise ValueError(f"{output_dir} holds an earlier federated run ({history_file} or {PREFIX}N). {resume} "
                         "another `output_dir`, or set `overwrite_output_dir=True` to replace it.")
    earlier = [name for _, name in round_folders(output_dir)]
    if earlier:
        logger.warning("overwrite_output_dir=True: deleting the earlier run's checkpoints in %s (%s) before the new "
                       "run starts", output_dir, ", ".join(earlier))
        for name in earlier:
            shutil.rmtree(os.path.join(output_dir, name))
