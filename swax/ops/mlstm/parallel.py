"""The mLSTM in its quadratic (parallel) and chunkwise-parallel forms, in plain autograd.

Within a chunk of ``L`` steps the outputs are the quadratic form plus the contribution of the
state at the chunk start; chunk-end states are carried by a loop over chunks (not over time).
``mode="parallel"`` of :func:`swax.ops.mlstm.mlstm` is one chunk of all ``T`` steps (one
``T × T`` matrix, a reference); the ``autograd`` backend of ``mode="chunk"`` runs chunks of
``chunk_size`` (the last, shorter one unpadded, so nothing leaks into the final state).
Log-decays inside a chunk are formed as segment sums of ``log f`` (never as differences of a
long cumulative sum), so very long sequences processed with state passing keep full precision.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from swax.ops.mlstm.recurrent import State


def _segsum(lf: torch.Tensor) -> torch.Tensor:
    """``out[..., t, j] = Σ_{j<s≤t} lf[..., s]`` for ``j ≤ t``, ``-inf`` above the diagonal.

    Summed directly (a masked cumulative sum over an ``L × L`` tile) rather than as a
    difference of prefix sums, so entries near zero stay exact whatever the prefix.
    """
    L = lf.shape[-1]
    ones = torch.ones(L, L, dtype=torch.bool, device=lf.device)
    x = lf[..., :, None].expand(*lf.shape, L)  # x[..., s, j] = lf_s
    x = x.masked_fill(~torch.tril(ones, diagonal=-1), 0.0)
    out = x.cumsum(-2)
    return out.masked_fill(~torch.tril(ones), -math.inf)


def _chunks_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    lf: torch.Tensor,
    state: State,
    eps: float,
) -> tuple[torch.Tensor, State]:
    """Process ``N`` consecutive chunks of equal length ``L`` starting from ``state``.

    Args: float32 ``q`` (already scaled by Dqk^-1/2) and ``k``: (B, H, N, L, Dqk);
    ``v``: (B, H, N, L, Dv); ``i`` and ``lf = logsigmoid(f)``: (B, H, N, L);
    ``state``: (C, n, m) at the start of the first chunk.
    Returns ``h``: (B, H, N, L, Dv) and the state after the last chunk.
    """
    C, n, m = state

    seg = _segsum(lf)  # (B, H, N, L, L) log-decay from step j to step t
    log_d = seg + i[..., None, :]  # intra-chunk log D_{t,j}
    b = lf.cumsum(-1)  # (B, H, N, L) log-decay from chunk start to t
    a = seg[..., -1, :] + i  # (B, H, N, L) log-weight of step j in the chunk-end state
    g = b[..., -1]  # (B, H, N) log-decay over the whole chunk
    a_max = a.amax(-1)  # (B, H, N)

    # Chunk summaries, stabilised by their own max: kv_c = Σ_j exp(a_j - a_max) k_j v_jᵀ.
    kw = k * torch.exp(a - a_max[..., None])[..., None]
    kv = kw.transpose(-1, -2) @ v  # (B, H, N, Dqk, Dv)
    ks = kw.sum(-2)  # (B, H, N, Dqk)

    # Inter-chunk recurrence (a loop over chunks, not over time). unbind, not kv[:, :, c]:
    # the backward of N separate selects would allocate N full-size zero tensors.
    Cs, ns, ms = [], [], []
    for g_c, amax_c, kv_c, ks_c in zip(g.unbind(2), a_max.unbind(2), kv.unbind(2), ks.unbind(2)):
        Cs.append(C)
        ns.append(n)
        ms.append(m)
        m_new = torch.maximum(g_c + m, amax_c)
        decay = torch.exp(g_c + m - m_new)  # 0 when m = -inf (empty state)
        scale = torch.exp(amax_c - m_new)
        C = decay[..., None, None] * C + scale[..., None, None] * kv_c
        n = decay[..., None] * n + scale[..., None] * ks_c
        m = m_new
    C0 = torch.stack(Cs, 2)  # (B, H, N, Dqk, Dv) state at each chunk start
    n0 = torch.stack(ns, 2)  # (B, H, N, Dqk)
    m0 = torch.stack(ms, 2)  # (B, H, N)

    # Outputs of all chunks at once: intra-chunk quadratic part + chunk-start state.
    m_inter = b + m0[..., None]  # (B, H, N, L), -inf for an empty start state
    m_t = torch.maximum(m_inter, log_d.amax(-1))  # true stabiliser m_t
    s = (q @ k.transpose(-1, -2)) * torch.exp(log_d - m_t[..., None])  # (B, H, N, L, L)
    q_inter = q * torch.exp(m_inter - m_t)[..., None]
    num = q_inter @ C0 + s @ v  # (B, H, N, L, Dv)
    den = (q_inter @ n0[..., None]).squeeze(-1) + s.sum(-1)  # (B, H, N, L)
    h = num / (torch.maximum(den.abs(), torch.exp(-m_t)) + eps)[..., None]
    return h, (C, n, m)


def _autograd_chunks(qf, kf, vf, i_f, f, state, L, eps):
    """The chunkwise form in plain autograd: full chunks of L steps, then the shorter tail
    chunk on its own (unpadded). qf already scaled; float32."""
    B, H, T, Dqk = qf.shape
    Dv = vf.shape[-1]
    lf = F.logsigmoid(f.float())
    L = min(L, T)
    n_full = T // L
    pieces = []
    for lo, hi, nc in ((0, n_full * L, n_full), (n_full * L, T, 1)):
        if hi == lo:
            continue
        ln = (hi - lo) // nc
        h_p, state = _chunks_forward(
            qf[:, :, lo:hi].reshape(B, H, nc, ln, Dqk),
            kf[:, :, lo:hi].reshape(B, H, nc, ln, Dqk),
            vf[:, :, lo:hi].reshape(B, H, nc, ln, Dv),
            i_f[:, :, lo:hi].reshape(B, H, nc, ln),
            lf[:, :, lo:hi].reshape(B, H, nc, ln),
            state,
            eps,
        )
        pieces.append(h_p.reshape(B, H, hi - lo, Dv))
    h = torch.cat(pieces, 2) if len(pieces) > 1 else pieces[0]
    return h, state


def autograd_backend(q, k, v, i, f, state, chunk_size, eps):
    Dqk = q.shape[-1]
    return _autograd_chunks(
        q.float() * Dqk**-0.5, k.float(), v.float(), i.float(), f, state, chunk_size, eps
    )
