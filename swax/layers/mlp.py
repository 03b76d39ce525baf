"""SwiGLU feed-forward layer."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def swiglu_hidden_dim(
    d_model: int, ratio: float = 8 / 3, multiple_of: int = 64, rounding: str = "swax"
) -> int:
    """Hidden width ``ratio * d_model`` rounded up to a multiple of ``multiple_of``: after
    rounding the product to the nearest integer (``rounding="swax"``), or on the product itself
    as transformers' xLSTM does (``"xlstm"``: ``int(((x + m - 1) // m) * m)``, which for a
    fractional x rounds x's integer part up)."""
    if rounding == "xlstm":
        return int(((d_model * ratio + multiple_of - 1) // multiple_of) * multiple_of)
    if rounding != "swax":
        raise ValueError(f"SwiGLU rounding must be 'swax' or 'xlstm', got {rounding!r}")
    h = int(round(ratio * d_model))
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def init_parts(self, std: float, out_std: float) -> list[tuple[str, Callable]]:
        """Normal(0, std) input projections; the output projection, which writes to the
        residual stream, Normal(0, out_std): one part per projection, in this order (a sharded
        build draws one part at a time)."""

        def normal(s: float) -> Callable[[nn.Module], None]:
            return lambda m: nn.init.normal_(m.weight, std=s)

        return [("gate", normal(std)), ("up", normal(std)), ("down", normal(out_std))]

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        for name, init in self.init_parts(std, out_std):
            init(self.get_submodule(name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))
