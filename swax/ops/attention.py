"""Causal sliding-window attention (and full causal attention as ``window=None``).

Convention (DESIGN §3): the query at position t sees keys t - W + 1 … t — W keys, itself
included — which is flash-attn's ``window_size=(W - 1, 0)``. ``W >= T`` is full causal attention.

Keys may be longer than queries (``Tk >= Tq``): queries are then aligned to the *end* of the keys
(query i sits at key position i + Tk - Tq), as in flash-attn. This is how chunked prefill and
decode attend to a cache of earlier keys.

Backends (chosen through :mod:`swax.ops.registry`, op name ``"swa"``):

- ``blockwise`` (any device; the CPU default): queries in blocks of ``bq``; each block attends to
  the ``bq + W - 1`` keys it can see, gathered as a strided view. Time and memory O(T·(W + bq)),
  never a T×T tensor. Full causal attention (``W >= Tk``) goes to PyTorch's fused
  ``scaled_dot_product_attention`` (memory-efficient on CPU and GPU).
- ``flash`` (CUDA, fp16/bf16, ``flash_attn`` installed): ``flash_attn_func`` with ``window_size``.
- ``flex`` (CUDA): ``torch.nn.attention.flex_attention`` with a sliding-window block mask.
- ``reference``: naive masked softmax over the full Tq×Tk score matrix — a readable reference for
  small inputs only.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from ._checks import check_floating, check_ndim
from .docs import check_doc_ids
from .registry import register_backend, select_backend


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
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int):
            raise ValueError(f"{fn}: window must be a positive int or None, got {window!r}")
        if window <= 0:
            raise ValueError(f"{fn}: window must be >= 1 (keys seen per query), got {window}")


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int | None,
    scale: float | None = None,
    backend: str | None = None,
    doc_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention where each query sees the last ``window`` keys (itself included).

    Args:
        q: (B, Hq, Tq, D). k: (B, Hkv, Tk, D), v: (B, Hkv, Tk, Dv) with Hq a multiple of Hkv
            (grouped-query attention: query head h uses key/value head h // (Hq // Hkv)) and
            Tk >= Tq (queries aligned to the end of the keys).
        window: W >= 1, or None for full causal attention.
        scale: score scale, default D ** -0.5.
        backend: ``"auto"``/None, ``"blockwise"``, ``"flash"``, ``"flex"`` or ``"reference"``.
        doc_ids: (B, T) document index of each token (packed documents, see
            :mod:`swax.ops.docs`): a query sees only keys of its own document. Needs Tq == Tk
            (no cache); blockwise and reference do it, flash and flex fall back to blockwise.

    Returns:
        (B, Hq, Tq, Dv) in q's dtype.
    """
    _check_inputs(q, k, v, window)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if doc_ids is not None:
        check_doc_ids(doc_ids, q.shape[0], q.shape[2], "sliding_window_attention")
        if k.shape[2] != q.shape[2]:
            raise ValueError(
                "sliding_window_attention: doc_ids need as many keys as queries (no cache), "
                f"got {k.shape[2]} keys for {q.shape[2]} queries"
            )
    impl = select_backend("swa", backend, q, k, v, window, doc_ids)
    if doc_ids is None:  # a backend registered without document support takes 5 arguments
        return impl.fn(q, k, v, window, scale)
    return impl.fn(q, k, v, window, scale, doc_ids)


# --------------------------------------------------------------------------------------------
# reference: naive masked softmax (Tq × Tk)


def _reference(q, k, v, window, scale, doc_ids=None):
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    kf = k.float().repeat_interleave(G, dim=1)
    vf = v.float().repeat_interleave(G, dim=1)
    s = (q.float() @ kf.transpose(-1, -2)) * scale
    qpos = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
    kpos = torch.arange(Tk, device=q.device)[None, :]
    mask = kpos <= qpos
    if window is not None:
        mask = mask & (qpos - kpos < window)
    if doc_ids is not None:  # (B, 1, Tq, Tk): same document only
        mask = mask & (doc_ids[:, None, :, None] == doc_ids[:, None, None, :])
    s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ vf).to(q.dtype)


# --------------------------------------------------------------------------------------------
# blockwise: O(T·W), any device


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    B, H, T, D = x.shape
    return x[:, :, None].expand(B, H, groups, T, D).reshape(B, H * groups, T, D)


def _causal_sdpa(q, k, v, scale, block: int = 512):
    """Full causal attention with queries aligned to the end of the keys, via fused SDPA."""
    B, Hq, Tq, D = q.shape
    Tk = k.shape[2]
    G = Hq // k.shape[1]
    upcast = q.device.type == "cpu" and q.dtype != torch.float32
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


def _block_size(window: int, tq: int) -> int:
    """Query block: about the window (waste (bq + W - 1) / W), at least 64, at most 256."""
    return max(1, min(tq, max(64, min(256, window))))


@lru_cache(maxsize=64)
def _band_mask(bq: int, window: int, device: torch.device) -> torch.Tensor:
    L = bq + window - 1
    r = torch.arange(bq, device=device)[:, None]
    c = torch.arange(L, device=device)[None, :]
    return (c >= r) & (c <= r + window - 1)


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
    upcast = q.device.type == "cpu" and q.dtype != torch.float32
    qq, kk, vv = (t.float() if upcast else t for t in (q, k, v))
    kk, vv = _expand_kv(kk, G), _expand_kv(vv, G)
    outs = []
    for s in range(0, T, block):
        e = min(T, s + block)
        pos = torch.arange(s, e, device=q.device)[:, None]
        mask = (torch.arange(e, device=q.device)[None, :] <= pos)[None, None]
        mask = mask & (doc_ids[:, None, s:e, None] == doc_ids[:, None, None, :e])
        outs.append(F.scaled_dot_product_attention(
            qq[:, :, s:e], kk[:, :, :e], vv[:, :, :e], attn_mask=mask, scale=scale))  # fmt: skip
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
    k_win = _key_windows(k.float(), W, bq, nb, off, pad_right)  # (B, Hkv, nb, L, D)
    v_win = _key_windows(v.float(), W, bq, nb, off, pad_right)  # (B, Hkv, nb, L, Dv)
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
    o = s.softmax(-1) @ v_win[:, :, None]  # (B, Hkv, G, nb, bq, Dv)
    o = o.reshape(B, Hq, nb * bq, Dv)[:, :, :Tq]
    return o.to(q.dtype)


# --------------------------------------------------------------------------------------------
# CUDA fast paths


def _flash_usable(q, k, v, window, doc_ids=None):
    if doc_ids is not None:
        return "document masking (doc_ids) is not implemented for it"
    if q.device.type != "cuda":
        return "needs CUDA"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"needs float16/bfloat16 inputs, got {q.dtype}"
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "flash_attn is not installed"
    return None


def _flash(q, k, v, window, scale, doc_ids=None):
    from flash_attn import flash_attn_func

    ws = (-1, -1) if window is None else (window - 1, 0)
    o = flash_attn_func(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        softmax_scale=scale,
        causal=True,
        window_size=ws,
    )
    return o.transpose(1, 2)


def _flex_usable(q, k, v, window, doc_ids=None):
    if doc_ids is not None:
        return "document masking (doc_ids) is not implemented for it"
    if q.device.type != "cuda":
        return "needs CUDA"
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return "torch.nn.attention.flex_attention is not available"
    return None


@lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


_FLEX_BLOCK = 128  # flex attention's default block size; lengths are rounded up to it


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _flex_shapes(tq: int, tk: int, window: int) -> tuple[int, int, int]:
    """(keys kept, padded queries, padded keys) for flex attention.

    Keys older than ``tq + window - 1`` are seen by no query and are dropped. Queries are padded
    to a multiple of the block size; keys to the same length when no cached key is left
    (``keep == tq``), else to the padded length of ``padded queries + window - 1``. So a
    (query length, window) pair compiles at most two kernels, whatever the cache length: chunked
    prefill does not recompile for every key length (it did, until torch._dynamo's recompile
    limit sent it to the slow eager path)."""
    keep = min(tk, tq + window - 1)
    tq_p = _round_up(tq, _FLEX_BLOCK)
    tk_p = tq_p if keep == tq else _round_up(tq_p + window - 1, _FLEX_BLOCK)
    return keep, tq_p, tk_p


@lru_cache(maxsize=32)
def _flex_block_mask(tq: int, tk: int, window: int, device: str):
    """Block mask for ``tq`` queries aligned to the end of ``tk`` keys (both then padded at
    the end, see :func:`_flex_shapes`). The offset and the window enter the mask as tensors,
    not Python ints, so masks of other lengths or windows reuse the compiled kernel."""
    from torch.nn.attention.flex_attention import create_block_mask

    _, tq_p, tk_p = _flex_shapes(tq, tk, window)
    off = torch.tensor(tk - tq, device=device)
    w = torch.tensor(window, device=device)

    def mask_mod(b, h, qi, ki):
        return (qi + off >= ki) & (qi + off - ki < w)

    return create_block_mask(mask_mod, None, None, tq_p, tk_p, device=device)


def _flex(q, k, v, window, scale, doc_ids=None):
    # nothing to mask beyond causality, or a single query: the fused SDPA kernels do it without
    # compiling a block mask per (Tq, Tk) (decode would otherwise recompile every token)
    Tq, Tk = q.shape[2], k.shape[2]
    if window is None or window >= Tk:
        return _causal_sdpa(q, k, v, scale)
    if Tq == 1:
        return _causal_sdpa(q, k[:, :, -window:], v[:, :, -window:], scale)
    keep, tq_p, tk_p = _flex_shapes(Tq, Tk, window)
    k, v = k[:, :, Tk - keep :], v[:, :, Tk - keep :]
    mask = _flex_block_mask(Tq, keep, window, str(q.device))
    qp = F.pad(q, (0, 0, 0, tq_p - Tq)) if tq_p > Tq else q
    kp, vp = (F.pad(x, (0, 0, 0, tk_p - keep)) if tk_p > keep else x for x in (k, v))
    out = _compiled_flex()(
        qp, kp, vp, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out[:, :, :Tq]


register_backend(
    "swa",
    "flash",
    _flash,
    _flash_usable,
    priority=30,
    doc="flash_attn_func with window_size=(W-1, 0); CUDA, fp16/bf16",
)
register_backend(
    "swa",
    "flex",
    _flex,
    _flex_usable,
    priority=20,
    doc="compiled flex attention with a sliding-window block mask; CUDA",
)
register_backend(
    "swa",
    "blockwise",
    _blockwise,
    priority=10,
    doc="query blocks against strided key windows, O(T·W); any device",
)
register_backend(
    "swa",
    "reference",
    _reference,
    priority=0,
    doc="naive masked softmax over Tq×Tk; small inputs only",
)
