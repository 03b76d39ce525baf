r"""Chunkwise mLSTM kernel with a hand-written backward (the ``native`` backend of ``mlstm``).

Computes exactly the function of :func:`swax.ops.mlstm.mlstm` (see its module docstring) on a
sequence of ``N`` equal chunks of ``L`` steps, forward and backward, with every chunk processed
at once in batched matmuls; only the ``(Dqk, Dv + 1)`` chunk-boundary states are carried by a
loop over chunks (one fused multiply-add per chunk).

Notation, per batch element, head and chunk (``t, j`` index steps inside the chunk)::

    lf_t  = logsigmoid(f_t)
    b_t   = lf_1 + … + lf_t            (float64, so differences keep their digits)
    g     = b_L                        (log-decay over the whole chunk)
    w_j   = i_j - b_j,   c = max_j w_j
    M     = stabiliser of the state at the chunk start (the true m there)
    r_t   = max(M, max_{j<=t} w_j),   m_t = b_t + r_t      (the cell's m_t, exactly)
    E_tj  = exp(w_j - r_t) [j <= t]    (= exp(log D_tj - m_t))
    S     = (q̃ kᵀ) ⊙ E
    [num | den] = q̃ ⊙ exp(M - r) @ [C0 | n0] + S @ [v | 1]
    h     = num / (max(|den|, exp(-m_t)) + eps)

and between chunks, with ``M_n`` the stabiliser at the start of chunk ``n``::

    M_{n+1} = max(g_n + M_n, g_n + c_n)            (a max-plus scan, done with cummax)
    [C|n]_{n+1} = exp(g_n + M_n - M_{n+1}) [C|n]_n + (k ⊙ exp(g_n + w - M_{n+1}))ᵀ [v | 1]

The gate bookkeeping (``b, w, r, M``) is O(T) and runs in float64; every exponent is formed
as a float64 difference and then rounded once, which is as exact as the segment sums of the
autograd path and cheaper than an ``L × L`` cumulative sum. Usually ``E`` is not formed at all:
``exp(w_j - r_t) = exp(c - r_t) · exp(w_j - c)`` turns ``S`` into one matmul of rescaled q and
k (see ``_SPREAD`` for when that is exact and what happens otherwise).

Backward: the chunkwise linear-attention backward — recompute ``S`` per chunk (nothing
``L × L`` is saved), a reverse loop over chunks for the state gradients (one multiply-add per
chunk), batched matmuls for ``dq, dk, dv`` — followed by the log-gate gradients: every exponent
above is a difference of the O(T) quantities ``b, w, c, r, M``, whose gradients flow through
the maxima that define them to the argument that attains them, as autograd's would. Where a
maximum picks the very term it is then subtracted from (``r_t = M``, ``M_{n+1} = g_n + M_n``)
the exponent is identically zero; its two large opposite gradients are dropped instead of
summed, so gates stay exact even where the state dominates (float32 sums of the two would lose
the small remainder). Saved for backward: q, k, [v | 1], the gates, the initial state, ``h``,
``den`` and the chunk-start states.

The functions are registered as ``torch.library`` custom ops (``swax::mlstm_chunk_fwd`` and
``swax::mlstm_chunk_bwd``) with fake implementations, so ``torch.compile`` treats them as
opaque calls with known output shapes and the Python loop over chunks is never unrolled.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["mlstm_chunkwise"]


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


def _bmm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Batched matmul over all leading dims (views when possible, no transposed copies);
    ``out``: a contiguous buffer to write into (its storage is reused)."""
    shape = (*a.shape[:-1], b.shape[-1])
    a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    if out is None:
        return torch.bmm(a3, b3).view(shape)
    out = out.view(shape)
    torch.bmm(a3, b3, out=out.view(-1, *shape[-2:]))
    return out


class _Dot:
    """Row-wise dot products sum(a * b, -1) through one reused product buffer (a fresh
    temporary per call would cost a large allocation each)."""

    def __init__(self):
        self.buf = None

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = a.numel()
        if self.buf is None or self.buf.numel() < n or self.buf.dtype != a.dtype:
            self.buf = torch.empty(n, dtype=a.dtype, device=a.device)
        prod = self.buf[:n].view(a.shape)
        torch.mul(a, b, out=prod)
        return prod.sum(-1)


def _baddbmm_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out += a @ b in place (out contiguous)."""
    out.view(-1, *out.shape[-2:]).baddbmm_(
        a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    )
    return out


def _exp(x: torch.Tensor, cd: torch.dtype) -> torch.Tensor:
    """exp in float64, rounded once to the compute dtype (O(T) vectors only)."""
    return torch.exp(x).to(cd)


class _Tiles:
    """What both passes recompute per chunk: q, k, the intra-chunk weights; the q scale is
    folded into the per-step factors."""

    def __init__(self, q, k, vx, gt, L, scale):
        B, H, T, D = q.shape
        N = T // L
        cd = q.dtype
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
        self.kh = self.k * self.beta[..., None]
        if self.exact:
            E = torch.empty(B, H, N, L, L, dtype=cd, device=q.device)
            # float64 difference, rounded once; E carries the q scale
            torch.sub(w[..., None, :], (r - ls)[..., :, None], out=E)
            E.add_(torch.full((L, L), -math.inf, dtype=cd, device=q.device).triu_(1)).exp_()
            self.E = E
            self.S = _bmm(self.q, self.k.transpose(-1, -2)).mul_(E)
        else:
            self.alpha = _exp(c[..., None] - r + ls, cd)  # <= scale · exp(_SPREAD)
            self.qh = self.q * self.alpha[..., None]
            self.S = _bmm(self.qh, self.kh.transpose(-1, -2)).tril_()


def _fwd_impl(q, k, v, i, f, C0, n0, m0, chunk_size: int, scale: float, eps: float):
    B, H, T, D = q.shape
    Dv = v.shape[-1]
    L = chunk_size
    N = T // L
    cd = q.dtype
    gt = _gates(i, f, m0, N, L)
    vx = torch.cat([v.reshape(B, H, N, L, Dv), v.new_ones(B, H, N, L, 1)], -1)
    tl = _Tiles(q, k, vx, gt, L, scale)

    # inter-chunk: chunk summaries, then the scan over chunk-start states
    KV = _bmm(tl.kh.transpose(-1, -2), tl.vx).mul_(tl.s[..., None, None])  # (B,H,N,D,Dv+1)
    decay = _exp(gt.g + gt.M[..., :-1] - gt.M[..., 1:], cd)  # 0 from an empty state
    Cs = torch.empty(B, H, N, D, Dv + 1, dtype=cd, device=q.device)
    Cs[:, :, 0, :, :Dv] = C0
    Cs[:, :, 0, :, Dv] = n0
    for n in range(N - 1):
        torch.addcmul(KV[:, :, n], decay[:, :, n, None, None], Cs[:, :, n], out=Cs[:, :, n + 1])
    C_end = torch.addcmul(KV[:, :, -1], decay[:, :, -1, None, None], Cs[:, :, -1])

    # outputs: chunk-start state read by q ⊙ fac, plus the intra-chunk part
    qi = torch.mul(tl.q, tl.fac[..., None], out=tl.qh if not tl.exact else None)
    Y = _baddbmm_(_bmm(qi, Cs), tl.S, tl.vx)  # (B, H, N, L, Dv+1)
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


class _ChunkGrads(NamedTuple):
    """Gradients of the all-chunks-at-once stage, and the log-scale terms it leaves for
    :func:`_bwd_log_gates`."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    gamma: torch.Tensor
    """(B, H, N, L): d log fac_t (fac_t = exp(M_n - r_t) · scale reads the chunk-start state)."""
    sigma: torch.Tensor
    """(B, H, N): d log s_n (s_n = exp(g_n + c_n - M_{n+1}) weighs the chunk-end writes)."""
    dr_rows: torch.Tensor
    """(B, H, N, L): d r_t through the intra-chunk weights."""
    dw: torch.Tensor
    """(B, H, N, L): d w_j through the intra-chunk weights and the end-state writes."""
    dc: torch.Tensor
    """(B, H, N): d c_n through the same."""


def _bwd_readout(dh, h, den, gt: _Gates, eps: float, dot: _Dot):
    """Through h = num / (max(|den|, exp(-m_t)) + eps): returns dY = [dnum | dden] (B, H, N, L,
    Dv + 1) and dm_t, the gradient reaching m_t through the floor exp(-m_t)."""
    B, H, N, L, Dv = dh.shape
    cd = dh.dtype
    den5 = den.reshape(B, H, N, L)
    em = _exp(-(gt.b + gt.r), cd)
    Qd = torch.maximum(den5.abs(), em) + eps
    dY = torch.empty(B, H, N, L, Dv + 1, dtype=cd, device=dh.device)
    torch.div(dh, Qd[..., None], out=dY[..., :Dv])
    dQ = -dot(dh, h.reshape(B, H, N, L, Dv)) / Qd  # d Qd = -(dh · h) / Qd
    # the max picks |den| or the floor; a tie splits the gradient evenly
    sel = (den5.abs() > em).to(cd) + 0.5 * (den5.abs() == em).to(cd)
    dY[..., Dv] = dQ * torch.sign(den5) * sel
    dm_t = -em * dQ * (1 - sel)  # d exp(-m_t) / d m_t = -exp(-m_t)
    return dY, dm_t


def _bwd_state_scan(tl: _Tiles, dY, dC_N, dn_N, decay):
    """Reverse scan over chunks: G[n] = gradient w.r.t. the end state of chunk n,
    G[n-1] = dCloc[n] + decay_n · G[n] with dCloc[n] = (q ⊙ fac)ᵀ dY of chunk n. Returns
    (q ⊙ fac, G, the initial state's gradient [dC | dn], G[n] · s_n)."""
    Dv = dC_N.shape[-1]
    qi = tl.q * tl.fac[..., None]
    dCloc = _bmm(qi.transpose(-1, -2), dY)  # (B, H, N, D, Dv+1), through the outputs
    G = torch.empty_like(dCloc)
    G[:, :, -1, :, :Dv] = dC_N
    G[:, :, -1, :, Dv] = dn_N
    for n in range(G.shape[2] - 1, 0, -1):
        torch.addcmul(dCloc[:, :, n], decay[:, :, n, None, None], G[:, :, n], out=G[:, :, n - 1])
    dC_init = torch.addcmul(dCloc[:, :, 0], decay[:, :, 0, None, None], G[:, :, 0])
    Gs = torch.mul(G, tl.s[..., None, None], out=dCloc)  # chunk n writes s_n khᵀ[v|1]
    return qi, G, dC_init, Gs


def _bwd_chunks(tl: _Tiles, dY, Cs, Gs, qi, dot: _Dot) -> _ChunkGrads:
    """dq, dk, dv of every chunk at once (batched matmuls), and the log-scale gradients of
    the factors they were built with. ``qi`` (q ⊙ fac) is reused as a buffer."""
    Dv = dY.shape[-1] - 1
    dnum = dY[..., :Dv]
    dv = _baddbmm_(_bmm(tl.S.transpose(-1, -2), dnum), tl.kh, Gs[..., :Dv])
    # dS overwrites S (no longer needed) unless the exact path still needs both
    dS = _bmm(dY, tl.vx.transpose(-1, -2), out=None if tl.exact else tl.S)  # (B,H,N,L,L)
    dq = _bmm(dY, Cs.transpose(-1, -2)).mul_(tl.fac[..., None])  # (B, H, N, L, D)
    gamma = dot(dq, tl.q)  # d log fac_t, fac_t = exp(M_n - r_t) · scale
    dkh = _bmm(tl.vx, Gs.transpose(-1, -2))  # through the end states; kh_j = k_j exp(w_j - c)
    sigma = dot(dkh, tl.kh).sum(-1)  # d log s_n
    if tl.exact:  # S = (q kᵀ) ⊙ E, E_tj = exp(w_j - r_t) · scale
        dlogE = dS * tl.S  # d log E_tj = dS_tj · S_tj
        dP = dS.mul_(tl.E)  # d (q kᵀ)
        _baddbmm_(dq, dP, tl.k)
        dr_rows = dlogE.sum(-1)
        dw = dlogE.sum(-2)
        del dlogE
        dk = dkh.mul_(tl.beta[..., None])
        lam = dot(dk, tl.k)  # d log beta_j (end-state writes only)
        dw += lam
        dc = -lam.sum(-1)  # log beta_j = w_j - c
        _baddbmm_(dk, dP.transpose(-1, -2), tl.q)
        del dP
    else:  # S = tril(q alpha (k beta)ᵀ), alpha_t = exp(c - r_t) · scale, beta_j = exp(w_j - c)
        dS.tril_()
        dqh = _bmm(dS, tl.kh, out=qi)  # qi is no longer needed
        _baddbmm_(dkh, dS.transpose(-1, -2), tl.qh)
        del dS
        dr_rows = dot(dqh, tl.qh)  # d log alpha_t
        dq.addcmul_(dqh, tl.alpha[..., None])
        dk = dkh.mul_(tl.beta[..., None])
        dw = dot(dk, tl.k)  # d log beta_j
        dc = dr_rows.sum(-1) - dw.sum(-1)
    return _ChunkGrads(dq, dk, dv, gamma, sigma, dr_rows, dw, dc)


def _bwd_log_gates(gt: _Gates, cg: _ChunkGrads, dm_t, dm_N, G, Cs, decay, f, m0, dot: _Dot):
    """The log-gate gradients (d i, d f) and d m0 from the gradients of the exponents.

    Every exponent is a difference of the quantities of :class:`_Gates`; gradients flow
    through the maxima that define r and M to the argument that attains them. Where a max
    picks the very term it is subtracted from (r_t = M_n, or M_{n+1} = g_n + M_n), the
    exponent is identically 0 and its two large, opposite gradients are dropped here rather
    than summed (as autograd's would cancel exactly)."""
    B, H, N, L = gt.w.shape
    cd, dev = cg.dw.dtype, cg.dw.device
    M, dw, gamma = gt.M, cg.dw, cg.gamma
    # r_t = max(M_n, cmw_t): w_inter is the share of the gradient that goes to M_n
    m0b = M[..., :-1, None].expand_as(gt.cmw)
    w_inter = (m0b > gt.cmw).to(cd) + 0.5 * (m0b == gt.cmw).to(cd)
    dr_rest = dm_t - cg.dr_rows  # d r_t apart from the fac term (-gamma)
    x = (gamma * (1 - w_inter) + dr_rest * w_inter).sum(-1)  # into M_n, (B, H, N)
    dw.scatter_add_(-1, gt.cmw_idx, (dr_rest - gamma) * (1 - w_inter))
    # chunk boundaries: M_{n+1} = max(g_n + M_n, g_n + c_n); rho_n: the first one wins
    rho = (M[..., :-1] >= gt.c).to(cd)
    delta = dot(G.flatten(-2), Cs.flatten(-2)) * decay  # d log decay_n = G_n · Cs_n · decay_n
    x = x + rho * -cg.sigma + (1 - rho) * delta  # s_n = exp(g + c - M_{n+1}) and decay_n
    dc = cg.dc + rho * cg.sigma - (1 - rho) * delta
    # dM_n = x_n + rho_n dM_{n+1}, dM_N = dm_N: a reverse scan whose terms restart where
    # rho = 0, done as differences of one reverse cumulative sum (float64): dM_n = RC_n -
    # RC_{end_n + 1}, end_n the first k >= n with rho_k = 0 (or N)
    xx = torch.cat([x, dm_N[..., None]], -1).double()
    RC = torch.cat([xx.flip(-1).cumsum(-1).flip(-1), xx.new_zeros(B, H, 1)], -1)
    idx = torch.arange(N + 1, device=dev).expand(B, H, N + 1)
    stop = torch.where(torch.cat([rho, rho.new_zeros(B, H, 1)], -1) == 0, idx, N)
    end = stop.flip(-1).cummin(-1).values.flip(-1)
    dM = (RC[..., :-1] - RC.gather(-1, end + 1)).to(cd)  # (B, H, N + 1)
    dg = dM[..., 1:].clone()
    dc = dc + (1 - rho) * dM[..., 1:]
    dw.scatter_add_(-1, gt.c_idx[..., None], dc[..., None])  # c_n = max_j w_j
    # w_j = i_j - b_j ; g = b_L ; m_t = b_t + r_t ; b = cumsum(logsigmoid(f))
    db = dm_t - dw
    db[..., -1] += dg
    # d f = reverse cumsum of d b times logsigmoid'(f) = sigmoid(-f)
    df = db.flip(-1).cumsum(-1).flip(-1) * torch.sigmoid(-f.reshape(B, H, N, L))
    # the first forget gate decays an empty state: its gradient is exactly zero (the sum above
    # cancels only to round-off)
    df[..., 0, 0] = torch.where(torch.isinf(m0), 0.0, df[..., 0, 0])
    dm_init = torch.where(torch.isfinite(m0), dM[..., 0], torch.zeros_like(dM[..., 0]))
    return dw, df, dm_init


def _bwd_impl(
    dh,
    dC_N,
    dn_N,
    dm_N,
    q,
    k,
    vx,
    i,
    f,
    C0,
    n0,
    m0,
    h,
    den,
    Cs,
    C_end,
    chunk_size: int,
    scale: float,
    eps: float,
):
    """Gradients of :func:`_fwd_impl` in four stages: the readout h = num / max(…), the
    reverse scan over chunk-end states, all chunks at once, and the log-gates."""
    B, H, T, D = q.shape
    Dv = vx.shape[-1] - 1
    L = chunk_size
    N = T // L
    gt = _gates(i, f, m0, N, L)
    tl = _Tiles(q, k, vx, gt, L, scale)
    dot = _Dot()  # one product buffer for every stage
    dY, dm_t = _bwd_readout(dh.reshape(B, H, N, L, Dv), h, den, gt, eps, dot)
    decay = _exp(gt.g + gt.M[..., :-1] - gt.M[..., 1:], q.dtype)
    qi, G, dC_init, Gs = _bwd_state_scan(tl, dY, dC_N, dn_N, decay)
    cg = _bwd_chunks(tl, dY, Cs, Gs, qi, dot)
    dw, df, dm_init = _bwd_log_gates(gt, cg, dm_t, dm_N, G, Cs, decay, f, m0, dot)
    return (
        cg.dq.reshape(B, H, T, D),
        cg.dk.reshape(B, H, T, D),
        cg.dv.reshape(B, H, T, Dv),  # dv is computed from vx's first Dv columns
        dw.reshape(B, H, T),
        df.reshape(B, H, T),
        dC_init[..., :Dv].contiguous(),
        dC_init[..., Dv].contiguous(),
        dm_init,
    )


# --------------------------------------------------------------------------- custom ops


@torch.library.custom_op("swax::mlstm_chunk_fwd", mutates_args=())
def _fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    C0: torch.Tensor,
    n0: torch.Tensor,
    m0: torch.Tensor,
    chunk_size: int,
    scale: float,
    eps: float,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]:
    with torch.no_grad():
        return _fwd_impl(q, k, v, i, f, C0, n0, m0, chunk_size, scale, eps)


@_fwd_op.register_fake
def _(q, k, v, i, f, C0, n0, m0, chunk_size, scale, eps):
    B, H, T, D = q.shape
    Dv = v.shape[-1]
    N = T // chunk_size
    return (
        q.new_empty(B, H, T, Dv),
        q.new_empty(B, H, D, Dv),
        q.new_empty(B, H, D),
        q.new_empty(B, H),
        q.new_empty(B, H, T),
        q.new_empty(B, H, N, D, Dv + 1),
        q.new_empty(B, H, D, Dv + 1),
        q.new_empty(B, H, N, chunk_size, Dv + 1),
    )


@torch.library.custom_op("swax::mlstm_chunk_bwd", mutates_args=())
def _bwd_op(
    dh: torch.Tensor,
    dC_N: torch.Tensor,
    dn_N: torch.Tensor,
    dm_N: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    vx: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    C0: torch.Tensor,
    n0: torch.Tensor,
    m0: torch.Tensor,
    h: torch.Tensor,
    den: torch.Tensor,
    Cs: torch.Tensor,
    C_end: torch.Tensor,
    chunk_size: int,
    scale: float,
    eps: float,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]:
    with torch.no_grad():
        return _bwd_impl(
            dh,
            dC_N,
            dn_N,
            dm_N,
            q,
            k,
            vx,
            i,
            f,
            C0,
            n0,
            m0,
            h,
            den,
            Cs,
            C_end,
            chunk_size,
            scale,
            eps,
        )


@_bwd_op.register_fake
def _(dh, dC_N, dn_N, dm_N, q, k, vx, i, f, C0, n0, m0, h, den, Cs, C_end, chunk_size, scale, eps):
    return (
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(h),
        torch.empty_like(i),
        torch.empty_like(f),
        torch.empty_like(C0),
        torch.empty_like(n0),
        torch.empty_like(m0),
    )


def _setup_context(ctx, inputs, output):
    q, k, v, i, f, C0, n0, m0, chunk_size, scale, eps = inputs
    h, _, _, _, den, Cs, C_end, vx = output
    ctx.save_for_backward(q, k, vx, i, f, C0, n0, m0, h, den, Cs, C_end)  # vx replaces v
    ctx.args = (chunk_size, scale, eps)
    ctx.mark_non_differentiable(den, Cs, C_end, vx)


def _backward(ctx, dh, dC, dn, dm, _dden, _dCs, _dC_end, _dvx):
    q, k, vx, i, f, C0, n0, m0, h, den, Cs, C_end = ctx.saved_tensors
    dh = torch.zeros_like(h) if dh is None else dh
    dC = torch.zeros_like(C0) if dC is None else dC
    dn = torch.zeros_like(n0) if dn is None else dn
    dm = torch.zeros_like(m0) if dm is None else dm
    grads = _bwd_op(
        dh.contiguous(),
        dC.contiguous(),
        dn.contiguous(),
        dm.contiguous(),
        q,
        k,
        vx,
        i,
        f,
        C0,
        n0,
        m0,
        h,
        den,
        Cs,
        C_end,
        *ctx.args,
    )
    return (*grads, None, None, None)


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def mlstm_chunkwise(q, k, v, i, f, C0, n0, m0, chunk_size: int, scale: float, eps: float):
    """The mLSTM over ``T = N · chunk_size`` steps from the stabilised state ``(C0, n0, m0)``
    (``m0 = -inf``: the empty state). All inputs in one floating dtype (float32, or float64
    for gradient checks); q unscaled (multiplied by ``scale`` inside).

    Returns ``h`` (B, H, T, Dv) and the final state ``(C, n, m)``; differentiable in every
    input, including the initial state.
    """
    T = q.shape[2]
    if T % chunk_size:
        raise ValueError(f"mlstm_chunkwise: T={T} is not a multiple of chunk_size={chunk_size}")
    args = [x.contiguous() for x in (q, k, v, i, f, C0, n0, m0)]
    h, C, n, m, _, _, _, _ = _fwd_op(*args, chunk_size, float(scale), float(eps))
    return h, (C, n, m)
