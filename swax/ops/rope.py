"""Rotary position embedding (RoPE) with an absolute position offset.

The rotation of a (B, H, T, D) tensor at sequence index t uses the angle
(offset + t) * base ** (-2j / D) for the pair of channels (j, j + D/2) (the "rotate half"
layout used by LLaMA and most open models). Angles are computed in float64 from the absolute
position, so decoding at position 100 000 or 10 000 000 uses exactly the right angles rather
than an accumulated or float32-rounded position.
"""

from __future__ import annotations

import torch


def rope_frequencies(dim: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """Inverse frequencies (dim // 2,) in float64 for a rotary dimension ``dim`` (even), made on
    ``device`` (no host-to-device copy: a decode step captured in a CUDA graph may not have
    one)."""
    if dim <= 0 or dim % 2:
        raise ValueError(f"rotary dimension must be a positive even number, got {dim}")
    if base <= 0:
        raise ValueError(f"rotary base must be > 0, got {base}")
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)


def rope_cos_sin(
    seq_len: int,
    dim: int,
    offset: int = 0,
    base: float = 10000.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (seq_len, dim) for positions offset … offset + seq_len - 1."""
    if offset < 0:
        raise ValueError(f"rotary position offset must be >= 0, got {offset}")
    inv = rope_frequencies(dim, base)
    pos = torch.arange(offset, offset + seq_len, dtype=torch.float64)
    ang = torch.outer(pos, inv)  # (T, dim/2), exact in float64 up to 2**53
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(device=device, dtype=dtype), ang.sin().to(device=device, dtype=dtype)


def apply_rope(
    x: torch.Tensor,
    offset: int = 0,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate ``x`` of shape (B, H, T, D) for absolute positions offset … offset + T - 1.

    ``rotary_dim`` (default D) rotates only the first ``rotary_dim`` channels (partial RoPE).
    ``positions`` (B, T) integer, if given, replaces offset … offset + T - 1 with a position per
    token and row (packed documents count from each document's start).
    The rotation is done in float32 and the result returned in ``x``'s dtype.
    """
    if x.ndim != 4:
        raise ValueError(
            f"apply_rope expects (batch, heads, time, dim), got shape {tuple(x.shape)}"
        )
    d = x.shape[-1] if rotary_dim is None else rotary_dim
    if d > x.shape[-1]:
        raise ValueError(f"rotary_dim {d} exceeds head dim {x.shape[-1]}")
    if positions is None:
        cos, sin = rope_cos_sin(x.shape[-2], d, offset, base, device=x.device)
    else:
        if tuple(positions.shape) != (x.shape[0], x.shape[2]) or bool((positions < 0).any()):
            raise ValueError(
                f"rope positions must be >= 0 with shape {(x.shape[0], x.shape[2])}, got "
                f"{tuple(positions.shape)}"
            )
        cos, sin = _cos_sin_at(positions, d, base, x.device)
    return _rotate(x, d, cos, sin)


def _cos_sin_at(positions: torch.Tensor, d: int, base: float, device) -> tuple:
    """cos and sin (B, 1, T, d) in float32 for integer ``positions`` (B, T)."""
    inv = rope_frequencies(d, base, device)
    ang = positions.to(torch.float64)[..., None] * inv  # (B, T, d/2), exact in float64
    ang = torch.cat([ang, ang], dim=-1)[:, None]  # (B, 1, T, d)
    return ang.cos().float(), ang.sin().float()


def apply_rope_at(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """:func:`apply_rope` of ``x`` (B, H, T, D) at integer ``positions`` (B, T), with no check
    that reads the values: nothing here syncs with the device or breaks a ``torch.compile``
    graph (a fixed-shape decode step; the caller guarantees positions >= 0)."""
    cos, sin = _cos_sin_at(positions, x.shape[-1], base, x.device)
    return _rotate(x, x.shape[-1], cos, sin)


def _rotate(x: torch.Tensor, d: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The first ``d`` channels of ``x`` rotated by the angles of ``cos``/``sin`` in float32,
    returned in ``x``'s dtype."""
    xr = x[..., :d].float()
    x1, x2 = xr[..., : d // 2], xr[..., d // 2 :]
    rotated = torch.cat([-x2, x1], dim=-1)
    out = (xr * cos + rotated * sin).to(x.dtype)
    if d == x.shape[-1]:
        return out
    return torch.cat([out, x[..., d:]], dim=-1)
