"""Short causal depthwise convolution over time, with its decode state (the last K - 1 inputs).

Used by the Gated DeltaNet layer (always) and the mLSTM layer (optional): each channel c of
``u`` (B, C, T) is convolved with its own K taps, output t seeing inputs t - K + 1 … t.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(
    u: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """y[:, c, t] = sum_j weight[c, j] · u[:, c, t - (K - 1) + j] for u (B, C, T) and weight
    (C, K), the inputs before t = 0 taken from ``state`` (B, C, K - 1) (zeros when None).
    Returns (y (B, C, T), new state: the last K - 1 inputs, earlier ones from ``state`` when
    T < K - 1)."""
    B, C, _ = u.shape
    K = weight.shape[1]
    if state is None:
        state = u.new_zeros(B, C, K - 1)
    uc = torch.cat([state.to(u.dtype), u], dim=2)  # (B, C, K - 1 + T)
    y = F.conv1d(uc, weight[:, None, :].to(u.dtype), groups=C)
    return y, uc[:, :, uc.shape[2] - (K - 1) :]
