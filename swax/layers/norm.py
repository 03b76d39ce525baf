"""Normalisation layers: RMSNorm and a per-head norm for recurrent mixers' outputs."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) * weight, reduced in float32 whatever the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The scale at 1."""
        self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class MultiHeadNorm(nn.Module):
    """Normalise each head of (..., H, D) separately, then scale by a weight over all H·D, or
    with ``shared`` by one weight of D that every head uses (Qwen3-Next's gated norm).

    ``kind="layer"`` centres and scales (xLSTM-7B's MultiHeadLayerNorm, no bias);
    ``kind="rms"`` only scales (Gated DeltaNet's output norm). Reductions in float32.
    Returns (..., H·D) in the input dtype.
    """

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        eps: float = 1e-6,
        kind: str = "layer",
        shared: bool = False,
    ):
        super().__init__()
        if kind not in ("layer", "rms"):
            raise ValueError(f"MultiHeadNorm kind must be 'layer' or 'rms', got {kind!r}")
        self.n_heads, self.head_dim, self.eps, self.kind = n_heads, head_dim, eps, kind
        self.shared = shared
        self.weight = nn.Parameter(torch.ones(head_dim if shared else n_heads * head_dim))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The scale at 1."""
        self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if self.kind == "layer":
            xf = xf - xf.mean(-1, keepdim=True)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.shared:
            return (y * self.weight.float()).flatten(-2).to(x.dtype)
        y = y.flatten(-2) * self.weight.float()
        return y.to(x.dtype)
