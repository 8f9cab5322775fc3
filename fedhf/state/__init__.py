from .store import ClientStateStore

__all__ = ["ClientStateStore"]
