"""Deprecated name of :mod:`swax.export.inference` (the inference loader: a model folder with
its tokenizer), kept for one release: importing it warns once and gives the same function."""

from __future__ import annotations

import warnings

from swax.export.inference import load_model_and_tokenizer

__all__ = ["load_model_and_tokenizer"]

warnings.warn(
    "swax.export.loading is renamed swax.export.inference (import load_model_and_tokenizer "
    "from there); the old name goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
