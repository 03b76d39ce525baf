"""The native chunkwise mLSTM kernel, part two: the hand-written backward (see
:mod:`swax.ops.mlstm.chunkwise` for the notation and what it recomputes; the gate bookkeeping
and the tiles it shares with the forward are in :mod:`swax.ops.mlstm.chunkwise_fwd`)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from swax.ops.mlstm.chunkwise_fwd import _baddbmm_, _bmm, _Dot, _exp, _Gates, _gates, _Tiles


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
    Dv, md = dC_N.shape[-1], tl.md
    qi = (tl.q * tl.fac[..., None]).to(md)
    dCloc = _bmm(qi.transpose(-1, -2), dY, md, dtype=dY.dtype)  # (B, H, N, D, Dv+1)
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
    Dv, md, cd = dY.shape[-1] - 1, tl.md, dY.dtype
    dYm = dY.to(md)  # the products' operand (dY itself unless bfloat16 tiles)
    dv = _bmm(tl.S.transpose(-1, -2), dYm[..., :Dv], md, dtype=cd)
    dv = _baddbmm_(dv, tl.kh, Gs[..., :Dv], md)
    # dS overwrites S (no longer needed) unless the exact path still needs both
    dS = _bmm(dYm, tl.vx.transpose(-1, -2), md, out=None if tl.exact else tl.S)  # (B,H,N,L,L)
    dq = _bmm(dYm, Cs.transpose(-1, -2), md, dtype=cd).mul_(tl.fac[..., None])  # (B,H,N,L,D)
    gamma = dot(dq, tl.q)  # d log fac_t, fac_t = exp(M_n - r_t) · scale
    dkh = _bmm(tl.vx, Gs.transpose(-1, -2), md, dtype=cd)  # through the end states
    sigma = dot(dkh, tl.kh).sum(-1)  # d log s_n; kh_j = k_j exp(w_j - c)
    if tl.exact:  # S = (q kᵀ) ⊙ E, E_tj = exp(w_j - r_t) · scale
        dlogE = dS.to(cd) * tl.S.to(cd)  # d log E_tj = dS_tj · S_tj
        dP = dS.mul_(tl.E)  # d (q kᵀ)
        _baddbmm_(dq, dP, tl.k, md)
        dr_rows = dlogE.sum(-1)
        dw = dlogE.sum(-2)
        del dlogE
        dk = dkh.mul_(tl.beta[..., None])
        lam = dot(dk, tl.k)  # d log beta_j (end-state writes only)
        dw += lam
        dc = -lam.sum(-1)  # log beta_j = w_j - c
        _baddbmm_(dk, dP.transpose(-1, -2), tl.q, md)
        del dP
    else:  # S = tril(q alpha (k beta)ᵀ), alpha_t = exp(c - r_t) · scale, beta_j = exp(w_j - c)
        dS.tril_()
        dqh = _bmm(dS, tl.kh, md, out=qi, dtype=cd)  # qi is no longer needed
        _baddbmm_(dkh, dS.transpose(-1, -2), tl.qh, md)
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
    tl = _Tiles(q, k, vx, gt, L, scale, C0.dtype)
    dot = _Dot()  # one product buffer for every stage
    dY, dm_t = _bwd_readout(dh.reshape(B, H, N, L, Dv), h, den, gt, eps, dot)
    decay = _exp(gt.g + gt.M[..., :-1] - gt.M[..., 1:], C0.dtype)
    qi, G, dC_init, Gs = _bwd_state_scan(tl, dY, dC_N, dn_N, decay)
    cg = _bwd_chunks(tl, dY, Cs, Gs, qi, dot)
    dw, df, dm_init = _bwd_log_gates(gt, cg, dm_t, dm_N, G, Cs, decay, f, m0, dot)
    return (  # q, k, v's gradients in their dtype (bfloat16 tiles), the rest in C0's
        cg.dq.reshape(B, H, T, D).to(q.dtype),
        cg.dk.reshape(B, H, T, D).to(k.dtype),
        cg.dv.reshape(B, H, T, Dv).to(vx.dtype),  # dv is computed from vx's first Dv columns
        dw.reshape(B, H, T),
        df.reshape(B, H, T),
        dC_init[..., :Dv].contiguous(),
        dC_init[..., Dv].contiguous(),
        dm_init,
    )
