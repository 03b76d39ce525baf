"""``blockwise_fwd``: the grad-free CPU forward (inference, prefill, evaluation).

The CPU default without a gradient for windows below 512, and for any window where compiled flex
is not taken. The same blocks as :mod:`swax.ops.swa.blockwise`, forward only: small query blocks
(16–64 rows, so that little of each key window is masked away), key windows as ``unfold`` views
of the keys (no copy), one ``bmm`` per group of blocks that fits in about 1 MiB of scores, the
band mask added in place and the softmax done in place; only the first blocks (whose windows
reach left of key 0) and a last partial block use small padded copies, all heads in one batched
product. Calls of up to 32k query rows over all heads (where the number of calls sets the time)
copy the keys of all heads into one zero-padded stream instead, so that a few products cover
every block of every head.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from swax.ops.precision import products_dtype
from swax.ops.swa.common import _band_mask, _causal_sdpa, _needs_grad, _round_up

_FWD_SCORE_BYTES = 1 << 20  # scores per bmm group: about L2-sized


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
    md = products_dtype(q)  # the streams, scores and outputs: bfloat16 tiles or float32
    ks = k.new_zeros(NH * slots * bq + L, D, dtype=md)
    vs = v.new_zeros(NH * slots * bq + L, Dv, dtype=md)
    body = slice(zero, lead + Tq)
    ks[: NH * slots * bq].view(B, Hkv, slots * bq, D)[:, :, body] = k[:, :, max(0, off - lead) :]
    vs[: NH * slots * bq].view(B, Hkv, slots * bq, Dv)[:, :, body] = v[:, :, max(0, off - lead) :]
    qs = q.new_zeros(B, Hkv, slots, G, bq, D, dtype=md)
    qv = F.pad(q, (0, 0, 0, nb * bq - Tq)).reshape(B, Hkv, G, nb, bq, D).transpose(2, 3)
    torch.mul(qv, scale, out=qs[:, :, :nb])
    qb = qs.view(NH * slots, G * bq, D)
    k_t = ks.unfold(0, L, bq)  # (windows, D, L): slot i's keys, transposed, a view
    v_w = vs.unfold(0, L, bq).transpose(1, 2)  # (windows, L, Dv)
    band = _flat_band(bq, window, lead, G)
    npad = -(-zero // bq)  # slots of a head whose windows reach the zeros
    pad = _pad_bias(npad, bq, zero, L) if npad else None
    o = q.new_empty(B, Hkv, slots, G, bq, Dv, dtype=md)
    of = o.view(NH * slots, G * bq, Dv)
    N = NH * slots
    g = max(1, min(N, _FWD_SCORE_BYTES // (G * bq * L * 4)))
    buf = torch.empty(g, G * bq, L, dtype=md)
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
    md = products_dtype(q)  # bfloat16: q·scale rounded once, the softmax in place in
    qs = (q.float() * scale).to(md)  # bfloat16 (float32 inside, as the products' rounding)
    kf, vf = k.to(md), v.to(md)
    out = torch.empty(B, Hq, Tq, Dv, dtype=md)
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
