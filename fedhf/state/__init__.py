"""The run's persistent state: checkpoints (safetensors + JSON, checksummed, atomic), the run state, rotation."""

from .checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint

__all__ = ["CheckpointError", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]
