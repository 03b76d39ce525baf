"""SwiGLU feed-forward layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def swiglu_hidden_dim(d_model: int, ratio: float = 8 / 3, multiple_of: int = 64) -> int:
    """Hidden width ``ratio * d_model`` rounded up to a multiple of ``multiple_of``."""
    h = int(round(ratio * d_model))
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        """Normal(0, std) input projections; the output projection, which writes to the
        residual stream, Normal(0, out_std)."""
        nn.init.normal_(self.gate.weight, std=std)
        nn.init.normal_(self.up.weight, std=std)
        nn.init.normal_(self.down.weight, std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))
