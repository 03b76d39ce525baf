"""What several commands share: loading a model and tokenizer from --model or --preset,
sizes in bytes."""

from __future__ import annotations

import torch

from swax.cli import options as C
from swax.export.inference import load_model_and_tokenizer


def load_for(cfg: C.LoadConfig):
    """(model, tokenizer, random weights?) for a config's --model or --preset."""

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
    model, tok = load_model_and_tokenizer(
        cfg.model, cfg.device, dtype, preset=cfg.preset, seed=cfg.seed
    )
    return model, tok, cfg.model is None


def preset_name(cfg: C.ModelChoice) -> str:
    return cfg.preset or "tiny"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"
