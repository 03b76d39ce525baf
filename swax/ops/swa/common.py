"""Helpers several sliding-window attention paths share: the input checks, grouped-query key
expansion, full causal attention through PyTorch's fused SDPA, the band mask of a query block,
and small integer helpers. Imports no sibling module."""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from swax.ops.checks import check_floating, check_ndim, check_window


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window) -> None:
    fn = "sliding_window_attention"
    check_floating(fn, q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_ndim(fn, name, t, 4, "(batch, heads, time, dim)")
    B, Hq, Tq, D = q.shape
    Bk, Hkv, Tk, Dk = k.shape
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if Bk != B or v.shape[0] != B:
        raise ValueError(f"{fn}: batch sizes differ: {shapes}")
    if Dk != D:
        raise ValueError(f"{fn}: q and k head dims differ: {shapes}")
    if v.shape[1] != Hkv or v.shape[2] != Tk:
        raise ValueError(f"{fn}: k and v must agree in heads and time: {shapes}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(
            f"{fn}: query heads ({Hq}) must be a multiple of key/value heads ({Hkv}) "
            f"for grouped-query attention"
        )
    if Tk < Tq:
        raise ValueError(
            f"{fn}: keys ({Tk}) must be at least as long as queries ({Tq}); queries align to "
            f"the end"
        )
    check_window(window, fn=fn)


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    B, H, T, D = x.shape
    return x[:, :, None].expand(B, H, groups, T, D).reshape(B, H * groups, T, D)


def _causal_sdpa(q, k, v, scale, block: int = 512):
    """Full causal attention with queries aligned to the end of the keys, via fused SDPA
    (bfloat16 inputs as they are: its CPU kernel accumulates and takes the softmax in float32;
    other dtypes than float32 upcast on a CPU)."""
    B, Hq, Tq, D = q.shape
    Tk = k.shape[2]
    G = Hq // k.shape[1]
    upcast = _cpu_upcast(q)
    qq, kk, vv = (t.float() if upcast else t for t in (q, k, v))
    kk, vv = _expand_kv(kk, G), _expand_kv(vv, G)
    if Tq == Tk:
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale)
    elif Tq == 1:
        out = F.scaled_dot_product_attention(qq, kk, vv, scale=scale)
    else:
        off = Tk - Tq
        outs = []
        for s in range(0, Tq, block):
            e = min(Tq, s + block)
            vis = off + e  # keys 0 … off + e - 1 are visible to some query of this block
            qpos = torch.arange(s, e, device=q.device)[:, None] + off
            mask = torch.arange(vis, device=q.device)[None, :] <= qpos
            outs.append(
                F.scaled_dot_product_attention(
                    qq[:, :, s:e], kk[:, :, :vis], vv[:, :, :vis], attn_mask=mask, scale=scale
                )
            )
        out = torch.cat(outs, dim=2)
    return out.to(q.dtype)


def _cpu_upcast(q: torch.Tensor) -> bool:
    """Whether fused SDPA on a CPU takes float32 copies: for dtypes other than float32 and
    bfloat16 (swax.ops.precision)."""
    return q.device.type == "cpu" and q.dtype not in (torch.float32, torch.bfloat16)


@lru_cache(maxsize=64)
def _band_mask(bq: int, window: int, device: torch.device) -> torch.Tensor:
    L = bq + window - 1
    r = torch.arange(bq, device=device)[:, None]
    c = torch.arange(L, device=device)[None, :]
    return (c >= r) & (c <= r + window - 1)


def _needs_grad(*xs: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m
