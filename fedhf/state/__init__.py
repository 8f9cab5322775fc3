from .checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from .store import ClientStateStore

__all__ = ["CheckpointError", "ClientStateStore", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]
