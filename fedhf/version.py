"""The package version, in one place (the model card and ``fedhf.__version__`` read it)."""

__version__ = "0.1.0"
