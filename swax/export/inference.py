"""A model for inference: a checkpoint folder with its tokenizer, or a preset with random weights.

from swax.export.inference import load_model_and_tokenizer
model, tok = load_model_and_tokenizer("runs/tiny/model", device="cuda")
"""

from __future__ import annotations

from pathlib import Path

import torch

from swax.config import SwaxConfig
from swax.core.settings import resolve_device
from swax.data import ByteTokenizer, load_model_tokenizer
from swax.model import SwaxLM, resolve_model_dir

__all__ = ["load_model_and_tokenizer"]


def load_model_and_tokenizer(
    model_dir: str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    *,
    preset: str | None = None,
    seed: int = 0,
):
    """(model, tokenizer), the model in eval mode on ``device`` (see
    :func:`swax.core.configs.resolve_device`): ``SwaxLM.from_pretrained(model_dir)`` with the
    tokenizer saved next to it; without ``model_dir``, the ``preset`` (default tiny) with random
    weights drawn from ``seed`` and the byte-level tokenizer."""

    device = resolve_device(device)
    if model_dir is not None:
        model_dir = resolve_model_dir(model_dir)  # a run folder stands for its model/
        model = SwaxLM.from_pretrained(model_dir, device=device, dtype=dtype)
        return model, load_model_tokenizer(model_dir)
    torch.manual_seed(seed)
    model = SwaxLM(SwaxConfig.preset(preset or "tiny")).to(device=device, dtype=dtype)
    return model.eval(), ByteTokenizer()
