"""``blockwise``: the training path (any device; the CPU default when a gradient is needed).

Queries in blocks of ``bq``; each block attends to the ``bq + W - 1`` keys it can see, gathered
from whole shifted blocks of the keys. Time and memory O(T·(W + bq)), never a T×T tensor. Full
causal attention (``W >= Tk``) goes to PyTorch's fused ``scaled_dot_product_attention``
(memory-efficient on CPU and GPU). Differentiated by autograd; ``torch.compile`` traces it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from swax.ops.precision import products_dtype
from swax.ops.swa.common import _band_mask, _causal_sdpa, _cpu_upcast, _expand_kv


def _block_size(window: int, tq: int) -> int:
    """Query block: about the window (waste (bq + W - 1) / W), at least 64, at most 256."""
    return max(1, min(tq, max(64, min(256, window))))


def _key_windows(x: torch.Tensor, W: int, bq: int, nb: int, off: int, pad_right: int):
    """(B, H, nb, bq + W - 1, D): for query block j, the keys it can see, oldest first.

    In padded coordinates absolute key a sits at a + W - 1 (zeros on the left) and block j's
    window starts at j·bq + off. The windows are assembled from whole bq-blocks shifted against
    each other (a concatenation, no as_strided/unfold, whose backward is slow and miscompiles
    under torch.compile on the CPU).
    """
    B, H, _, D = x.shape
    n_prev = -(-(W - 1) // bq)  # blocks needed before the query block
    extra = n_prev * bq - (W - 1)  # further zeros so that the stream starts on a block
    xp = F.pad(x, (0, 0, W - 1 + extra, pad_right))[:, :, off:]
    blocks = xp.reshape(B, H, n_prev + nb, bq, D)
    parts = [blocks[:, :, i : i + nb] for i in range(n_prev + 1)]
    return torch.cat(parts, dim=3)[:, :, :, extra:]


def _doc_sdpa(q, k, v, scale, doc_ids, block: int = 512):
    """Full causal attention within documents (Tq == Tk), query blocks against their keys."""
    B, Hq, T, D = q.shape
    G = Hq // k.shape[1]
    upcast = _cpu_upcast(q)
    qq, kk, vv = (t.float() if upcast else t for t in (q, k, v))
    kk, vv = _expand_kv(kk, G), _expand_kv(vv, G)
    outs = []
    for s in range(0, T, block):
        e = min(T, s + block)
        pos = torch.arange(s, e, device=q.device)[:, None]
        mask = (torch.arange(e, device=q.device)[None, :] <= pos)[None, None]
        mask = mask & (doc_ids[:, None, s:e, None] == doc_ids[:, None, None, :e])
        outs.append(
            F.scaled_dot_product_attention(
                qq[:, :, s:e], kk[:, :, :e], vv[:, :, :e], attn_mask=mask, scale=scale
            )
        )
    return torch.cat(outs, dim=2).to(q.dtype)


def _blockwise(q, k, v, window, scale, doc_ids=None):
    B, Hq, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    if (window is None or window >= Tk) and doc_ids is not None:
        return _doc_sdpa(q, k, v, scale, doc_ids)
    if window is None or window >= Tk:
        return _causal_sdpa(q, k, v, scale)
    G = Hq // Hkv
    W = window
    off = Tk - Tq
    bq = _block_size(W, Tq)
    nb = math.ceil(Tq / bq)
    L = bq + W - 1
    pad_right = nb * bq - Tq
    md = products_dtype(q)  # bfloat16 tiles, float32 scores and softmax; else all float32
    k_win = _key_windows(k.to(md), W, bq, nb, off, pad_right)  # (B, Hkv, nb, L, D)
    v_win = _key_windows(v.to(md), W, bq, nb, off, pad_right)  # (B, Hkv, nb, L, Dv)
    if md == torch.bfloat16:  # the scale applied to the float32 scores
        qb = F.pad(q, (0, 0, 0, pad_right)).view(B, Hkv, G, nb, bq, D)
        s = (qb @ k_win[:, :, None].transpose(-1, -2)).float().mul_(scale)
    else:
        qb = F.pad(q.float() * scale, (0, 0, 0, pad_right)).view(B, Hkv, G, nb, bq, D)
        s = qb @ k_win[:, :, None].transpose(-1, -2)  # (B, Hkv, G, nb, bq, L)
    band = _band_mask.__wrapped__ if torch.compiler.is_compiling() else _band_mask
    mask = band(bq, W, q.device)
    if off < W - 1:  # the first blocks reach left of key 0: mask the zero padding
        start = torch.arange(nb, device=q.device)[:, None] * bq + off
        valid = (start + torch.arange(L, device=q.device)[None, :]) >= W - 1  # (nb, L)
        mask = mask[None] & valid[:, None, :]
    if doc_ids is not None:  # (B, 1, 1, nb, bq, L): keys of the query's own document
        d = doc_ids[:, None, :, None]
        k_doc = _key_windows(d, W, bq, nb, off, pad_right)[..., 0]  # (B, 1, nb, L)
        q_doc = F.pad(doc_ids, (0, pad_right)).view(B, 1, nb, bq)
        mask = mask & (q_doc[..., None] == k_doc[:, :, :, None, :])[:, :, None]
    s = s.masked_fill(~mask, float("-inf"))
    o = s.softmax(-1).to(md) @ v_win[:, :, None]  # (B, Hkv, G, nb, bq, Dv)
    o = o.reshape(B, Hq, nb * bq, Dv)[:, :, :Tq]
    return o.to(q.dtype)
