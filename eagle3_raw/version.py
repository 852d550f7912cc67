"""The version of eagle3_raw (as ``pyproject.toml`` says; manifests and ``--version`` print it)."""

__version__ = "0.1.0"
