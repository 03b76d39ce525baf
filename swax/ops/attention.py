"""Causal sliding-window attention (and full causal attention as ``window=None``).

Convention (DESIGN §3): the query at position t sees keys t - W + 1 … t — W keys, itself
included — which is flash-attn's ``window_size=(W - 1, 0)``. ``W >= T`` is full causal attention.

Keys may be longer than queries (``Tk >= Tq``): queries are then aligned to the *end* of the keys
(query i sits at key position i + Tk - Tq), as in flash-attn. This is how chunked prefill and
decode attend to a cache of earlier keys.

Backends (chosen through :mod:`swax.ops.registry`, op name ``"swa"``):

- ``blockwise`` (any device; the CPU default when a gradient is needed): queries in blocks of
  ``bq``; each block attends to the ``bq + W - 1`` keys it can see, gathered as a strided view.
  Time and memory O(T·(W + bq)), never a T×T tensor. Full causal attention (``W >= Tk``) goes to
  PyTorch's fused ``scaled_dot_product_attention`` (memory-efficient on CPU and GPU).
- ``blockwise_fwd`` (CPU, no gradient needed: inference, prefill, evaluation; the CPU default
  there for windows below 512, and for any window where compiled flex is not taken): the same
  blocks, forward only. Small query blocks (16–64 rows, so that little of each key window is
  masked away), key windows as ``unfold`` views of the keys (no copy), one ``bmm`` per group of
  blocks that fits in about 1 MiB of scores, the band mask added in place and the softmax done in
  place; only the first blocks (whose windows reach left of key 0) and a last partial block use
  small padded copies, all heads in one batched product. Calls of up to 32k query rows over all
  heads (where the number of calls sets the time) copy the keys of all heads into one
  zero-padded stream instead, so that a few products cover every block of every head.
- ``flash`` (CUDA, fp16/bf16, ``flash_attn`` installed): ``flash_attn_func`` with ``window_size``.
- ``flex``: ``torch.nn.attention.flex_attention``, compiled, with a sliding-window block mask
  (built from the window's block structure, never a T×T mask). CUDA (``"auto"`` takes it there),
  and the CPU for float32 inputs without gradient (its CPU backward does not exist), inductor's
  CPU template present, outside ``torch.compile`` and within the recompile budget. On the CPU
  ``"auto"`` takes it for windows of 512 or more in calls of 256 queries or more: there its
  fused kernel is faster than ``blockwise_fwd`` (and than fused SDPA where the window covers
  the keys) on one and on two threads, and elsewhere it is slower (benchmarks/README.md). Its
  first CPU call compiles (seconds; a second length compiles once more, after which lengths are
  symbolic and nothing recompiles), announced by a warning; ``SWAX_CPU_FLEX=0`` in the
  environment, :func:`cpu_flex_default` ``(False)`` (``swax generate`` runs in it) or naming
  ``blockwise_fwd`` avoids it. If compiling fails it logs a warning and the call, and every
  later one, uses the next backend.
- ``reference``: naive masked softmax over the full Tq×Tk score matrix — a readable reference for
  small inputs only.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F

from swax.ops.checks import check_floating, check_ndim, check_window
from swax.ops.packing import check_doc_ids
from swax.ops.registry import log, register_backend, select_backend, warn_once


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
            :mod:`swax.ops.packing`): a query sees only keys of its own document. Needs Tq == Tk
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
# blockwise_fwd: the grad-free CPU forward

_FWD_SCORE_BYTES = 1 << 20  # scores per bmm group: about L2-sized


def _needs_grad(*xs: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _fwd_usable(q, k, v, window, doc_ids=None):
    if doc_ids is not None:
        return "document masking (doc_ids) is not implemented for it"
    if q.device.type != "cpu":
        return "CPU only"
    if _needs_grad(q, k, v):
        return "forward only: a gradient is needed"
    if torch.compiler.is_compiling():
        return "not traced by torch.compile (the blockwise path is)"
    return None


def _fwd_block(window: int) -> int:
    """Query rows per block: W/8 within [16, 64] (a block wastes (bq - 1) of its bq + W - 1
    keys; much smaller blocks make the matmuls inefficient)."""
    return max(16, min(64, window // 8))


@lru_cache(maxsize=64)
def _band_bias(bq: int, window: int) -> torch.Tensor:
    """(bq, bq + W - 1) float32: 0 where row r sees column c (r <= c <= r + W - 1), else -inf."""
    return torch.zeros(bq, bq + window - 1).masked_fill_(~_band_mask(bq, window, "cpu"), -math.inf)


def _fwd_core(qb, kk, vv, window, bias, out):
    """Query blocks ``qb`` (n, bq, D), already scaled, against keys ``kk`` / values ``vv``
    (n·bq + W - 1, D) whose window for block j starts at row j·bq; writes ``out`` (n, bq, Dv).
    ``bias``: the band's (bq, L)."""
    n, bq, _ = qb.shape
    L = bq + window - 1
    k_t = kk.unfold(0, L, bq)  # (n, D, L): block j's keys, transposed, a view
    v_w = vv.unfold(0, L, bq).transpose(1, 2)  # (n, L, Dv)
    g = max(1, min(n, _FWD_SCORE_BYTES // (bq * L * 4)))
    buf = torch.empty(g, bq, L, dtype=qb.dtype)
    for j0 in range(0, n, g):
        j1 = min(n, j0 + g)
        s = torch.bmm(qb[j0:j1], k_t[j0:j1], out=buf[: j1 - j0])
        s.add_(bias)
        torch.ops.aten._softmax.out(s, -1, False, out=s)  # in place, row by row
        torch.bmm(s, v_w[j0:j1], out=out[j0:j1])


@lru_cache(maxsize=64)
def _pad_bias(n: int, bq: int, lp: int, width: int | None = None) -> torch.Tensor:
    """(n, 1, width) float32 (width ``lp`` by default): -inf where column c of block j's
    padded key window is one of the ``lp`` zero rows before key 0 (c + j·bq < lp), else 0; the
    same for every row of a block."""
    col = torch.arange(width or lp)[None, :] + torch.arange(n)[:, None] * bq
    return torch.zeros(n, 1, width or lp).masked_fill_((col < lp)[:, None, :], -math.inf)


_FWD_EDGE_BYTES = 8 << 20  # scores of one edge product over several batch rows, at most


def _fwd_padded(qs, kf, vf, a, z, off, window, bq, out):
    """Queries a … z-1 of every head at once (the first blocks, whose windows reach left of
    key 0, and a last partial block), on padded copies of their keys; writes ``out``'s rows
    a … z-1. One batched product per group of blocks over all heads (broadcast over the query
    heads of a key/value head), so that these few blocks cost a handful of calls, not a handful
    per head; batch rows in slices of at most 8 MiB of scores per block."""
    B, Hq = qs.shape[:2]
    step = max(1, _FWD_EDGE_BYTES // (Hq * bq * (bq + window - 1) * 4))
    for b0 in range(0, B, step):
        sl = slice(b0, b0 + step)
        _fwd_padded_rows(qs[sl], kf[sl], vf[sl], a, z, off, window, bq, out[sl])


def _fwd_padded_rows(qs, kf, vf, a, z, off, window, bq, out):
    B, Hq, _, D = qs.shape
    Hkv, Dv = kf.shape[1], vf.shape[-1]
    G, L = Hq // Hkv, bq + window - 1
    n = -(-(z - a) // bq)
    k0 = a + off - window + 1  # key of the first window's first column
    lp = max(0, -k0)
    need = n * bq + window - 1
    kk, vv = (x[:, :, max(0, k0) : k0 + need] for x in (kf, vf))
    rp = need - lp - kk.shape[2]
    kk, vv = (F.pad(x, (0, 0, lp, rp)) for x in (kk, vv))
    k_t = kk.unfold(2, L, bq)[:, :, None]  # (B, Hkv, 1, n, D, L)
    v_w = vv.unfold(2, L, bq).transpose(-1, -2)[:, :, None]  # (B, Hkv, 1, n, L, Dv)
    qb = F.pad(qs[:, :, a:z], (0, 0, 0, n * bq - (z - a))).view(B, Hkv, G, n, bq, D)
    bias, pad = _band_bias(bq, window), _pad_bias(n, bq, lp) if lp else None
    g = max(1, min(n, _FWD_SCORE_BYTES // (B * Hq * bq * L * 4)))
    o = qb.new_empty(B, Hkv, G, n, bq, Dv)
    for j0 in range(0, n, g):
        j1 = min(n, j0 + g)
        s = torch.matmul(qb[:, :, :, j0:j1], k_t[:, :, :, j0:j1])  # (B, Hkv, G, g, bq, L)
        s.add_(bias)
        if pad is not None:  # the zero rows before key 0: only the first lp columns
            s[..., :lp].add_(pad[j0:j1])
        torch.ops.aten._softmax.out(s, -1, False, out=s)
        o[:, :, :, j0:j1] = torch.matmul(s, v_w[:, :, :, j0:j1])
    out[:, :, a:z] = o.view(B, Hq, n * bq, Dv)[:, :, : z - a]


_FWD_FLAT_ROWS = 1 << 15  # query rows (all heads) up to which the one-stream path is taken


def _flat_fits(rows: int, tq: int, window: int, bq: int) -> bool:
    """Whether :func:`_fwd_flat` suits a call: a few thousand queries over all heads (beyond,
    its copies of the keys cost more than its fewer calls save), its key windows at most a
    quarter block longer than the band's (``lead`` rounds W - 1 up to whole blocks), and the
    slots it computes for nothing (``lead / bq`` per head) at most as many as the real ones."""
    lead = _round_up(window - 1, bq)
    return (
        rows * (tq + window) <= _FWD_FLAT_ROWS
        and 4 * (lead - (window - 1)) <= bq
        and lead <= _round_up(tq, bq)
    )


@lru_cache(maxsize=64)
def _flat_band(bq: int, window: int, lead: int, groups: int) -> torch.Tensor:
    """(G·bq, L) float32 for :func:`_fwd_flat`: 0 where row r of a block (query at stream row
    ``lead + r`` of its window) sees column c (``0 <= lead + r - c <= W - 1``), else -inf; the
    same rows again for each of the G query heads of a key/value head."""
    L = lead + bq
    d = lead + torch.arange(bq)[:, None] - torch.arange(L)[None, :]
    band = torch.zeros(bq, L).masked_fill_((d < 0) | (d > window - 1), -math.inf)
    return band.repeat(groups, 1)


def _fwd_flat(q, k, v, window, scale):
    """:func:`_blockwise_fwd` for calls of a few thousand queries, where the number of calls,
    not the arithmetic, sets the time: the keys of all heads laid end to end in one zero-padded
    stream, so that every query block of every head — the first ones included — has its window
    at a multiple of ``bq`` in it, and a few products over all of them do the work.

    Per key/value head the stream is ``lead = ⌈(W-1)/bq⌉·bq`` rows before query 0's key, then
    the keys; block j of a head (its queries in the rows ``lead + j·bq …``) sees the ``lead + bq``
    rows from ``j·bq``. Rows before key 0 are zeros, masked by column in the blocks that reach
    them; the windows of the last ``lead / bq`` slots of a head run into the next head's stream
    and are computed for nothing (their queries are zeros)."""
    B, Hq, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[-1]
    G, off, bq = Hq // Hkv, Tk - Tq, _fwd_block(window)
    lead, nb = _round_up(window - 1, bq), -(-Tq // bq)
    slots, L, NH = lead // bq + nb, lead + bq, B * Hkv
    zero = max(0, lead - off)  # zero rows before key 0 in each head's stream
    ks = k.new_zeros(NH * slots * bq + L, D, dtype=torch.float32)
    vs = v.new_zeros(NH * slots * bq + L, Dv, dtype=torch.float32)
    body = slice(zero, lead + Tq)
    ks[: NH * slots * bq].view(B, Hkv, slots * bq, D)[:, :, body] = k[:, :, max(0, off - lead) :]
    vs[: NH * slots * bq].view(B, Hkv, slots * bq, Dv)[:, :, body] = v[:, :, max(0, off - lead) :]
    qs = q.new_zeros(B, Hkv, slots, G, bq, D, dtype=torch.float32)
    qv = F.pad(q, (0, 0, 0, nb * bq - Tq)).reshape(B, Hkv, G, nb, bq, D).transpose(2, 3)
    torch.mul(qv, scale, out=qs[:, :, :nb])
    qb = qs.view(NH * slots, G * bq, D)
    k_t = ks.unfold(0, L, bq)  # (windows, D, L): slot i's keys, transposed, a view
    v_w = vs.unfold(0, L, bq).transpose(1, 2)  # (windows, L, Dv)
    band = _flat_band(bq, window, lead, G)
    npad = -(-zero // bq)  # slots of a head whose windows reach the zeros
    pad = _pad_bias(npad, bq, zero, L) if npad else None
    o = q.new_empty(B, Hkv, slots, G, bq, Dv, dtype=torch.float32)
    of = o.view(NH * slots, G * bq, Dv)
    N = NH * slots
    g = max(1, min(N, _FWD_SCORE_BYTES // (G * bq * L * 4)))
    buf = torch.empty(g, G * bq, L)
    for a in range(0, N, g):
        z = min(N, a + g)
        s = torch.bmm(qb[a:z], k_t[a:z], out=buf[: z - a])
        s.add_(band)
        for h in range(a // slots, (z - 1) // slots + 1) if pad is not None else ():
            p0, p1 = max(a, h * slots), min(z, h * slots + npad)
            if p1 > p0:  # this head's first slots: mask the zeros before key 0
                s[p0 - a : p1 - a].add_(pad[p0 - h * slots : p1 - h * slots])
        torch.ops.aten._softmax.out(s, -1, False, out=s)
        torch.bmm(s, v_w[a:z], out=of[a:z])
    out = o[:, :, :nb].transpose(2, 3).reshape(B, Hq, nb * bq, Dv)[:, :, :Tq]
    return out.to(q.dtype)


def _blockwise_fwd(q, k, v, window, scale):
    """Forward of :func:`_blockwise` without autograd (the same math, other blocks)."""
    Tk = k.shape[2]
    if window is None or window >= Tk:
        return _causal_sdpa(q, k, v, scale)
    B, Hq, Tq, D = q.shape
    G, Dv, off = Hq // k.shape[1], v.shape[-1], Tk - Tq
    bq = _fwd_block(window)
    if _flat_fits(B * Hq, Tq, window, bq):
        return _fwd_flat(q, k, v, window, scale)
    qs = q.float() * scale
    kf, vf = k.float(), v.float()
    out = torch.empty(B, Hq, Tq, Dv)
    nbf = Tq // bq  # whole blocks
    j_edge = min(nbf, max(0, -(-(window - 1 - off) // bq)))  # windows reaching left of key 0
    a, z = j_edge * bq, nbf * bq
    if z > a:  # the other whole blocks, head by head: the keys themselves, as views
        bias = _band_bias(bq, window)
        k0 = a + off - window + 1
        for b in range(B):
            for h in range(Hq):
                kh, vh, oh = kf[b, h // G, k0 : z + off], vf[b, h // G, k0 : z + off], out[b, h]
                _fwd_core(
                    qs[b, h, a:z].view(-1, bq, D), kh, vh, window, bias, oh[a:z].view(-1, bq, Dv)
                )
    for a, z in ((0, j_edge * bq), (nbf * bq, Tq)):
        if z > a:
            _fwd_padded(qs, kf, vf, a, z, off, window, bq, out)
    return out.to(q.dtype)


# --------------------------------------------------------------------------------------------
# flash (CUDA) and flex (CUDA; CPU without grad)


def _flash_environment(device: str | None) -> str | None:
    if device != "cuda":
        return "needs CUDA"
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "flash_attn is not installed"
    except Exception as e:  # noqa: BLE001 - a build that does not match the installed torch
        return f"flash_attn does not import ({type(e).__name__}: {e})"
    return None


def _flash_usable(q, k, v, window, doc_ids=None):
    """None when flash-attn takes these inputs (its environment checked before)."""
    if doc_ids is not None:
        return "document masking (doc_ids) is not implemented for it"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"needs float16/bfloat16 inputs, got {q.dtype}"
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
    if q.device.type not in ("cuda", "cpu"):
        return "needs CUDA or the CPU"
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return "torch.nn.attention.flex_attention is not available"
    return _flex_cpu_usable(q, k, v, window) if q.device.type == "cpu" else None


_FLEX_CPU_STATE: dict = {"failed": None, "shapes": set(), "announced": False}


@lru_cache(maxsize=1)
def _flex_cpu_template() -> str | None:
    import importlib.util

    name = "torch._inductor.codegen.cpp_flex_attention_template"
    try:  # found, not imported: importing inductor's codegen first would be circular
        found = importlib.util.find_spec(name) is not None
    except ImportError:
        found = False
    return None if found else f"inductor's CPU flex template ({name}) is missing"


def _flex_cpu_budget() -> int:
    """Kernels compiled before torch._dynamo's recompile limit would send flex to eager mode
    (which builds T×T scores)."""
    cfg = torch._dynamo.config
    return max(1, getattr(cfg, "recompile_limit", getattr(cfg, "cache_size_limit", 8)) - 1)


def _flex_cpu_compiled() -> int:
    """Kernels compiled so far for swax's CPU flex frame; where torch does not say, the number
    of shapes run (an upper bound: lengths after the second are symbolic)."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(_flex_call_cpu.__code__))
    except Exception:  # noqa: BLE001 - a private torch helper: count shapes instead
        return len(_FLEX_CPU_STATE["shapes"])


def _flex_cpu_usable(q, k, v, window):
    if _needs_grad(q, k, v):
        return "on the CPU its backward is not implemented (forward only, no gradient)"
    if q.dtype != torch.float32:
        return f"on the CPU, float32 inputs only, got {q.dtype}"
    if torch.compiler.is_compiling():
        return "on the CPU, not inside torch.compile"
    if _FLEX_CPU_STATE["failed"]:
        return _FLEX_CPU_STATE["failed"]
    reason = _flex_cpu_template()
    if reason:
        return reason
    if _flex_shape_key(q, k, v, window) not in _FLEX_CPU_STATE["shapes"]:
        compiled = _flex_cpu_compiled()
        if compiled >= _flex_cpu_budget():
            return f"{compiled} kernels compiled already (torch._dynamo's recompile limit)"
    return None


CPU_FLEX_MIN_WINDOW = 512
"""From this window on, ``"auto"`` takes compiled flex on the CPU (forward, no gradient): its
fused kernel is faster there than ``blockwise_fwd`` (and than fused SDPA where the window covers
the keys), on one thread and on two; below it ``blockwise_fwd`` is faster in long calls (W=128:
1.04-1.29x flex from T=1024, benchmarks/README.md). Flex is faster in some short ones below 512
too (W=256 at T=1024: 0.83x / 0.71x on one / two threads; batches of 16 256-token sequences
at W=128: 0.68x / 0.60x); they stay on ``blockwise_fwd`` until a rule for them is measured."""

CPU_FLEX_MIN_QUERIES = 256
"""... in calls of at least this many queries: with fewer (a 128-query block padded to flex's
block size, a decode step) ``blockwise_fwd`` is faster or as fast."""


CPU_FLEX_ENV = "SWAX_CPU_FLEX"
"""Set to 0 (or false / off / no) and ``"auto"`` never takes compiled flex on the CPU: no
compile pause, at the speed of ``blockwise_fwd``; set to 1 (true / on / yes) and it does where
it is faster, also inside :func:`cpu_flex_default` ``(False)`` (as in ``swax generate``).
Asking for flex by name works either way."""

_CPU_FLEX_DEFAULT = [True]


@contextmanager
def cpu_flex_default(allowed: bool):
    """Within the block, whether ``"auto"`` may compile flex on the CPU when ``SWAX_CPU_FLEX``
    does not say. A one-shot job that runs little attention (``swax generate``: one prompt)
    turns it off: the compile (3–9 s, once per process) costs more than it saves there."""
    _CPU_FLEX_DEFAULT.append(bool(allowed))
    try:
        yield
    finally:
        _CPU_FLEX_DEFAULT.pop()


def _cpu_flex_off() -> bool:
    env = os.environ.get(CPU_FLEX_ENV, "").strip().lower()
    if env in ("0", "false", "off", "no"):
        return True
    return not (env in ("1", "true", "on", "yes") or _CPU_FLEX_DEFAULT[-1])


def _flex_prefer(q, k, v, window, doc_ids=None):
    """Where ``"auto"`` takes flex: on CUDA, and on the CPU for long windows in calls of 256
    queries or more (unless turned off, see :data:`CPU_FLEX_ENV`)."""
    if q.device.type != "cpu":
        return None
    if window is None:
        return "the CPU, full causal attention: fused SDPA"
    if window < CPU_FLEX_MIN_WINDOW:
        return f"the CPU, windows below {CPU_FLEX_MIN_WINDOW}: blockwise_fwd is faster"
    if q.shape[2] < CPU_FLEX_MIN_QUERIES:
        return f"the CPU, fewer than {CPU_FLEX_MIN_QUERIES} queries: blockwise_fwd is faster"
    if _cpu_flex_off():
        return f"the CPU: turned off ({CPU_FLEX_ENV} or cpu_flex_default)"
    return None


def _flex_shape_key(q, k, v, window):
    Tq, Tk = q.shape[2], k.shape[2]
    _, tq_p, tk_p = _flex_shapes(Tq, Tk, min(window or Tk, Tk))
    return (q.shape[0], q.shape[1], k.shape[1], tq_p, tk_p, q.shape[3], v.shape[3], q.dtype)


def _flex_call(q, k, v, block_mask, scale, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _flex_call_cpu(q, k, v, block_mask, scale, enable_gqa):
    """The same call in a frame of its own: the CPU's compiled kernels (dynamic lengths) are
    counted apart from CUDA's."""
    return _flex_call(q, k, v, block_mask, scale, enable_gqa)


@lru_cache(maxsize=2)
def _compiled_flex(cpu: bool = False):
    """swax's own compiled frames: torch._dynamo's recompile limit counts compilations per
    frame, so a caller's own ``torch.compile(flex_attention)`` shapes do not use up swax's. On
    the CPU lengths are dynamic: the first length compiles, the second compiles once more with
    symbolic lengths, and later lengths reuse that kernel (CUDA keeps static shapes)."""
    if cpu:
        return torch.compile(_flex_call_cpu, dynamic=True)
    return torch.compile(_flex_call, dynamic=False)


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


def _band_blocks(nq: int, nk: int, off: int, window: int, device) -> tuple:
    """(partial, full) (nq, nk) bools: which (query block, key block) pairs of the band
    (key <= query + off < key + window) some / all of their pairs see. From the blocks' corners,
    O(nq·nk): no T×T mask is ever made."""
    blk = _FLEX_BLOCK
    first = torch.arange(nq, device=device)[:, None] * blk + off  # key position of 1st query
    last = first + blk - 1
    k0 = torch.arange(nk, device=device)[None, :] * blk
    k1 = k0 + blk - 1
    some = (k0 <= last) & (k1 > first - window)
    full = (k1 <= first) & (k0 > last - window)
    return some & ~full, full


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(count, indices) per query block, the marked key blocks first, as BlockMask wants."""
    num = blocks.sum(-1).to(torch.int32)[None, None]
    idx = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, idx[None, None]


@lru_cache(maxsize=32)
def _flex_block_mask(tq: int, tk: int, window: int, device: str):
    """Block mask for ``tq`` queries aligned to the end of ``tk`` keys (both then padded at
    the end, see :func:`_flex_shapes`). The offset and the window enter the mask as tensors,
    not Python ints, so masks of other lengths or windows reuse the compiled kernel."""
    from torch.nn.attention.flex_attention import BlockMask

    _, tq_p, tk_p = _flex_shapes(tq, tk, window)
    off = torch.tensor(tk - tq, device=device)
    w = torch.tensor(window, device=device)

    def mask_mod(b, h, qi, ki):
        return (qi + off >= ki) & (qi + off - ki < w)

    partial, full = _band_blocks(tq_p // _FLEX_BLOCK, tk_p // _FLEX_BLOCK, tk - tq, window, device)
    return BlockMask.from_kv_blocks(
        *_ordered(partial), *_ordered(full), _FLEX_BLOCK, mask_mod, seq_lengths=(tq_p, tk_p)
    )


def _flex(q, k, v, window, scale, doc_ids=None):
    # nothing to mask beyond causality, or a single query: the fused SDPA kernels do it without
    # compiling a block mask per (Tq, Tk) (decode would otherwise recompile every token); on the
    # CPU a window covering all keys is a causal band, faster in flex than in SDPA
    Tq, Tk = q.shape[2], k.shape[2]
    cpu = q.device.type == "cpu"
    if window is None or (window >= Tk and not cpu):
        return _causal_sdpa(q, k, v, scale)
    if Tq == 1:
        return _causal_sdpa(q, k[:, :, -window:], v[:, :, -window:], scale)
    if cpu:  # one memory layout (a layer's transposed views, a cache's contiguous keys, padded
        # queries), or dynamo compiles again for each layout on top of the two for the lengths
        qp, kp, vp, mask = _flex_padded(q, k, v, window)
        qp, kp, vp = (x.contiguous() for x in (qp, kp, vp))
        return _flex_cpu_call(q, k, v, window, scale, (qp, kp, vp, mask))
    return _flex_banded(q, k, v, window, scale, _compiled_flex())


def _flex_padded(q, k, v, window):
    """(queries, keys, values, block mask) for flex: the keys no query sees dropped, queries
    and keys padded at the end to whole blocks (see :func:`_flex_shapes`)."""
    Tq, Tk = q.shape[2], k.shape[2]
    window = min(window, Tk)
    keep, tq_p, tk_p = _flex_shapes(Tq, Tk, window)
    kk, vv = k[:, :, Tk - keep :], v[:, :, Tk - keep :]
    mask = _flex_block_mask(Tq, keep, window, str(q.device))
    qp = F.pad(q, (0, 0, 0, tq_p - Tq)) if tq_p > Tq else q
    kp, vp = (F.pad(x, (0, 0, 0, tk_p - keep)) if tk_p > keep else x for x in (kk, vv))
    return qp, kp, vp, mask


def _flex_banded(q, k, v, window, scale, call):
    """flex's CUDA branch around ``call`` (compiled flex_attention there; the tests pass the
    eager one on the CPU, with gradients): padding, block mask, GQA, the output's slice."""
    qp, kp, vp, mask = _flex_padded(q, k, v, window)
    out = call(qp, kp, vp, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[:, :, : q.shape[2]]


def _flex_cpu_call(q, k, v, window, scale, padded):
    """The compiled flex call on the CPU; if it fails (no compiler, an inductor error), logs a
    warning and runs this and every later call on the next backend."""
    qp, kp, vp, mask = padded
    state = _FLEX_CPU_STATE
    if not state["announced"]:
        state["announced"] = True
        # a warning, so that it is seen: the compile is a pause of seconds with no other output
        log.warning("swax: swa on the CPU: compiling flex attention (no gradient, window %d); "
                    "this takes seconds, once or twice per process (%s=0 avoids it)",
                    window, CPU_FLEX_ENV)  # fmt: skip
    try:
        out = _compiled_flex(cpu=True)(
            qp, kp, vp, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
    except Exception as e:  # noqa: BLE001 - any compile failure: fall back, never crash
        state["failed"] = f"compiling it failed on this CPU ({type(e).__name__}: {str(e)[:120]})"
        chosen = select_backend("swa", "auto", q, k, v, window)
        warn_once("swa", "flex", state["failed"], chosen.name)
        return chosen.fn(q, k, v, window, scale)
    state["shapes"].add(_flex_shape_key(q, k, v, window))
    return out[:, :, : q.shape[2]]


register_backend(
    "swa",
    "flash",
    _flash,
    _flash_usable,
    priority=30,
    doc="flash_attn_func with window_size=(W-1, 0); CUDA, fp16/bf16",
    environment=_flash_environment,
    packages=("flash-attn",),
)
register_backend(
    "swa",
    "flex",
    _flex,
    _flex_usable,
    priority=20,
    doc="compiled flex attention with a sliding-window block mask; CUDA, CPU without grad",
    prefer=_flex_prefer,
    packages=("torch",),
)
register_backend(
    "swa",
    "blockwise_fwd",
    _blockwise_fwd,
    _fwd_usable,
    priority=15,
    doc="forward-only query blocks against unfold-view key windows; CPU, no gradient",
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
