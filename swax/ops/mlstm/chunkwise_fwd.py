"""The native chunkwise mLSTM kernel, part one: the float64 gate bookkeeping, the per-chunk
tiles both passes recompute, and the forward pass (see :mod:`swax.ops.mlstm.chunkwise` for the
notation and for the custom ops that call it; the backward is in
:mod:`swax.ops.mlstm.chunkwise_bwd`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

_SPREAD = 40.0
"""Largest ``max_j w_j - r_t`` inside a chunk for which the intra-chunk weights are computed
factorised, ``exp(w_j - r_t) = exp(c - r_t) · exp(w_j - c)``: no factor overflows float32 and
a factor that underflows only drops weights below ``exp(40 - 87)``. Chunks of strongly closing
forget gates exceed it; the call then forms the ``L × L`` exponents directly (exact path)."""


class _Gates(NamedTuple):
    """The float64 gate bookkeeping of N chunks of L steps (see the module docstring)."""

    b: torch.Tensor
    """(B, H, N, L): b_t = lf_1 + … + lf_t inside each chunk."""
    g: torch.Tensor
    """(B, H, N): b_L, the log-decay over each whole chunk."""
    w: torch.Tensor
    """(B, H, N, L): w_j = i_j - b_j."""
    c: torch.Tensor
    """(B, H, N): max_j w_j of each chunk."""
    c_idx: torch.Tensor
    """(B, H, N): the j attaining c."""
    M: torch.Tensor
    """(B, H, N+1): stabiliser at each chunk start; M[..., N] the final one."""
    cmw: torch.Tensor
    """(B, H, N, L): running max_{j<=t} w_j."""
    cmw_idx: torch.Tensor
    """(B, H, N, L): the j attaining cmw_t."""
    r: torch.Tensor
    """(B, H, N, L): r_t = max(M_n, cmw_t), so m_t = b_t + r_t."""
    exact: bool
    """Whether a chunk spreads its weights beyond _SPREAD (form the L × L exponents)."""


def _gates(i: torch.Tensor, f: torch.Tensor, m_init: torch.Tensor, N: int, L: int) -> _Gates:
    """Float64 gate bookkeeping for N chunks of L steps. i, f: (B, H, N*L); m_init: (B, H)."""
    B, H = i.shape[:2]
    b = F.logsigmoid(f).view(B, H, N, L).double().cumsum(-1)  # (B, H, N, L)
    g = b[..., -1]  # (B, H, N)
    w = i.double().view(B, H, N, L) - b
    c, c_idx = w.max(-1)  # (B, H, N); the max of a_j = g + w_j is g + c
    # M_{n+1} = max(g_n + M_n, g_n + c_n) unrolled: with P_n = sum_{l<n} g_l,
    # M_n = P_n + max(m_init, max_{l<n} (g_l + c_l - P_{l+1})), a running max (cummax)
    P = torch.cat([g.new_zeros(B, H, 1), g.cumsum(-1)], -1)  # (B, H, N+1): sum_{l<n} g_l
    seq = torch.cat([m_init.double()[..., None], g + c - P[..., 1:]], -1)
    R = seq.cummax(-1).values
    M = P + R  # (B, H, N+1): stabiliser at each chunk start; M[..., N] the final one
    cmw, cmw_idx = w.cummax(-1)
    r = torch.maximum(M[..., :N, None], cmw)  # (B, H, N, L); m_t = b_t + r_t
    # r is nondecreasing in t, so the largest c - r_t of a chunk is at t = 0
    exact = bool((c - r[..., 0] > _SPREAD).any())
    return _Gates(b, g, w, c, c_idx, M, cmw, cmw_idx, r, exact)


def _bmm(
    a: torch.Tensor,
    b: torch.Tensor,
    md: torch.dtype,
    out: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Batched matmul over all leading dims (views when possible, no transposed copies) of
    ``a`` and ``b`` cast to ``md``, the products' dtype (float32 accumulation in every dtype);
    the result in ``md``, or in ``dtype`` when given. ``out``: a contiguous ``md`` buffer to
    write into (its storage is reused); a buffer of another dtype is not used."""
    shape = (*a.shape[:-1], b.shape[-1])
    a3, b3 = a.reshape(-1, *a.shape[-2:]).to(md), b.reshape(-1, *b.shape[-2:]).to(md)
    if out is None or out.dtype != md:
        r = torch.bmm(a3, b3).view(shape)
    else:
        r = out.view(shape)
        torch.bmm(a3, b3, out=r.view(-1, *shape[-2:]))
    return r if dtype is None else r.to(dtype)


class _Dot:
    """Row-wise dot products sum(a * b, -1) in ``a``'s dtype (the compute dtype: pass the wider
    operand first) through one reused product buffer (a fresh temporary per call would cost a
    large allocation each)."""

    def __init__(self):
        self.buf = None

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = a.numel()
        if self.buf is None or self.buf.numel() < n or self.buf.dtype != a.dtype:
            self.buf = torch.empty(n, dtype=a.dtype, device=a.device)
        prod = self.buf[:n].view(a.shape)
        torch.mul(a, b, out=prod)
        return prod.sum(-1)


def _baddbmm_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, md: torch.dtype) -> torch.Tensor:
    """out += a @ b in place (out contiguous), the product in ``md`` (see :func:`_bmm`)."""
    a3, b3 = a.reshape(-1, *a.shape[-2:]).to(md), b.reshape(-1, *b.shape[-2:]).to(md)
    if out.dtype == md:
        out.view(-1, *out.shape[-2:]).baddbmm_(a3, b3)
    else:  # a low-precision product added to a float32 accumulator
        out.view(-1, *out.shape[-2:]).add_(torch.bmm(a3, b3))
    return out


def _exp(x: torch.Tensor, cd: torch.dtype) -> torch.Tensor:
    """exp in float64, rounded once to the compute dtype (O(T) vectors only)."""
    return torch.exp(x).to(cd)


class _Tiles:
    """What both passes recompute per chunk: q, k, the intra-chunk weights; the q scale is
    folded into the per-step factors. ``md`` is the products' dtype (q's: bfloat16 tiles, or
    float32/float64 as the rest), ``cd`` that of everything else (the gates, the states)."""

    def __init__(self, q, k, vx, gt, L, scale, cd):
        B, H, T, D = q.shape
        N = T // L
        self.md = md = q.dtype
        self.q = q.reshape(B, H, N, L, D)
        self.k = k.reshape(B, H, N, L, D)
        self.vx = vx
        M, r, w, c = gt.M, gt.r, gt.w, gt.c
        ls = math.log(scale)
        # weight of step j in the chunk-end state: exp(a_j - M_{n+1}) = s_n · exp(w_j - c)
        self.s = _exp(gt.g + c - M[..., 1:], cd)  # (B, H, N)
        self.fac = _exp(M[..., :-1, None] - r + ls, cd)  # q ⊙ fac reads the chunk-start state
        self.exact = gt.exact
        self.beta = _exp(w - c[..., None], cd)  # <= 1
        self.kh = (self.k * self.beta[..., None]).to(md)
        if self.exact:
            E = torch.empty(B, H, N, L, L, dtype=cd, device=q.device)
            # float64 difference, rounded once; E carries the q scale
            torch.sub(w[..., None, :], (r - ls)[..., :, None], out=E)
            E.add_(torch.full((L, L), -math.inf, dtype=cd, device=q.device).triu_(1)).exp_()
            self.E = E
            self.S = _bmm(self.q, self.k.transpose(-1, -2), md).mul_(E)
        else:
            self.alpha = _exp(c[..., None] - r + ls, cd)  # <= scale · exp(_SPREAD)
            self.qh = (self.q * self.alpha[..., None]).to(md)
            self.S = _bmm(self.qh, self.kh.transpose(-1, -2), md).tril_()


def _fwd_impl(q, k, v, i, f, C0, n0, m0, chunk_size: int, scale: float, eps: float):
    """The forward: q, k, v in the products' dtype (bfloat16, or that of the rest), the gates
    and the state in the compute dtype; h and the states returned in the compute dtype."""
    B, H, T, D = q.shape
    Dv = v.shape[-1]
    L = chunk_size
    N = T // L
    cd, md = C0.dtype, q.dtype
    gt = _gates(i, f, m0, N, L)
    vx = torch.cat([v.reshape(B, H, N, L, Dv), v.new_ones(B, H, N, L, 1)], -1)
    tl = _Tiles(q, k, vx, gt, L, scale, cd)

    # inter-chunk: chunk summaries, then the scan over chunk-start states (in cd)
    KV = _bmm(tl.kh.transpose(-1, -2), tl.vx, md, dtype=cd).mul_(tl.s[..., None, None])
    decay = _exp(gt.g + gt.M[..., :-1] - gt.M[..., 1:], cd)  # 0 from an empty state
    Cs = torch.empty(B, H, N, D, Dv + 1, dtype=cd, device=q.device)
    Cs[:, :, 0, :, :Dv] = C0
    Cs[:, :, 0, :, Dv] = n0
    for n in range(N - 1):
        torch.addcmul(KV[:, :, n], decay[:, :, n, None, None], Cs[:, :, n], out=Cs[:, :, n + 1])
    C_end = torch.addcmul(KV[:, :, -1], decay[:, :, -1, None, None], Cs[:, :, -1])

    # outputs: chunk-start state read by q ⊙ fac, plus the intra-chunk part
    qi = torch.mul(tl.q, tl.fac[..., None], out=tl.qh if not tl.exact else None)
    Y = _baddbmm_(_bmm(qi, Cs, md, dtype=cd), tl.S, tl.vx, md)  # (B, H, N, L, Dv+1)
    den = Y[..., Dv]
    Qd = torch.maximum(den.abs(), _exp(-(gt.b + gt.r), cd)) + eps
    h = (Y[..., :Dv] / Qd[..., None]).reshape(B, H, T, Dv)
    return (
        h,
        C_end[..., :Dv].contiguous(),
        C_end[..., Dv].contiguous(),
        gt.M[..., N].to(cd),
        den.reshape(B, H, T).contiguous(),
        Cs,
        C_end,
        vx,
    )
