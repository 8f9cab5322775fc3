"""State-sync rules, by name (the ``state_sync`` field of FederatedConfig)."""

from ..core.registry import Registry
from .compressed import CompressedAverage, compression_rank, low_rank
from .desloc import DesLoc
from .rules import AverageWarmstart, PersistLocal, Reset, StateSync

STATE_SYNCS: Registry[type] = Registry("state sync", "state_sync")
STATE_SYNCS.register("reset")(Reset)
STATE_SYNCS.register("persist_local")(PersistLocal)
STATE_SYNCS.register("average_warmstart")(AverageWarmstart)
STATE_SYNCS.register("compressed_average")(CompressedAverage)
STATE_SYNCS.register("desloc")(DesLoc)

__all__ = ["STATE_SYNCS", "AverageWarmstart", "CompressedAverage", "DesLoc", "PersistLocal", "Reset", "StateSync",
           "compression_rank", "low_rank"]
