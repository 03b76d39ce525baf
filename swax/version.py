"""The version of swax, written once (pyproject.toml reads it for the build)."""

__version__ = "0.1.0"
