r"""The gated delta rule in chunkwise (WY / UT) form: ``mode="chunk"`` and the ``native``
backend of :func:`swax.ops.gated_delta.gated_delta_rule` (the recurrence it unrolls is in the
package docstring).

Split time into chunks of ``C`` steps. Inside a chunk with start state ``S0`` let
``G_t = g_1 + ... + g_t`` (local cumulative log-decay, so ``G_t - G_j <= 0`` for ``j <= t``).
Unrolling the recurrence gives ``S_t = exp(G_t) S0 + sum_{j<=t} exp(G_t - G_j) k_j u_j^T`` and
therefore::

    u_t + sum_{j<t} beta_t exp(G_t - G_j) (k_t . k_j) u_j = beta_t v_t - beta_t exp(G_t) S0^T k_t

In matrix form ``(I + A) U = diag(beta) V - diag(beta exp(G)) K S0`` with ``A`` strictly
lower triangular, ``A[t, j] = beta_t exp(G_t - G_j) k_t . k_j``. With the UT transform
``T = (I + A)^{-1}`` (a unit-lower-triangular solve, independent of the state)::

    U     = T diag(beta) V  -  T diag(beta exp(G)) K S0  =:  U_v - W_k S0
    O     = diag(exp(G)) Q S0 + (Q K^T * D) U,           D[t, j] = exp(G_t - G_j) [j <= t]
    S_C   = exp(G_C) S0 + (diag(exp(G_C - G)) K)^T U

where ``Q`` already carries ``scale``. ``G_t - G_j`` is summed directly over the segment
``g_{j+1} + ... + g_t`` rather than as a difference of cumulative sums, which would lose
digits in float32 once ``G`` is large (e.g. a few ``g = -20`` steps in one chunk).
Everything except the three state lines is computed for all chunks at once; only the state
is carried chunk to chunk in a Python loop. Every exponent is ``<= 0``, so no term can
overflow, and memory is ``O(T * C)``, never ``T x T``.
The last chunk is padded with ``q = k = v = 0``, ``g = 0``, ``beta = 0``, which is an exact
identity step (the state is unchanged), so padding never reaches the final state.

Differentiated by autograd (the graph holds ``C × C`` tiles per chunk, never ``T × T``, and
loops over chunks, never over time steps). :func:`plain_solve` swaps the triangular solve for
forward substitution in plain tensor ops (for exporters such as ONNX).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

_PLAIN_SOLVE = False


@contextmanager
def plain_solve() -> Iterator[None]:
    """Within the block the chunk form solves its triangular system by forward substitution in
    plain tensor ops (for exporters without ``linalg_solve_triangular``, such as ONNX)."""
    global _PLAIN_SOLVE
    saved, _PLAIN_SOLVE = _PLAIN_SOLVE, True
    try:
        yield
    finally:
        _PLAIN_SOLVE = saved


def _solve_unit_lower(A: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """X with (I + A) X = rhs for A strictly lower triangular (..., C, C)."""
    if not _PLAIN_SOLVE:
        return torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    rows = [rhs[..., 0, :]]
    for t in range(1, A.shape[-1]):  # x_t = r_t - sum_{j<t} A[t, j] x_j
        done = torch.stack(rows, -2)
        rows.append(rhs[..., t, :] - (A[..., t : t + 1, :t] @ done).squeeze(-2))
    return torch.stack(rows, -2)


def _mm(a: torch.Tensor, b: torch.Tensor, md: torch.dtype) -> torch.Tensor:
    """a @ b on operands cast to ``md``, the products' dtype (:mod:`swax.ops.precision`)."""
    return a.to(md) @ b.to(md)


def _chunk(q, k, v, g, beta, S, chunk_size: int):
    """The chunk form on q (scaled), k, v in the products' dtype (bfloat16 tiles, or that of
    the rest) and g, beta, S in the compute dtype (float32/float64), in which the gates, the
    triangular solve and the state stay; ``o`` comes back in the compute dtype."""
    md = q.dtype
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    C = chunk_size if T >= chunk_size else max(T, 1)  # a short sequence is one short chunk
    N = -(-T // C)
    pad = N * C - T
    if pad:
        # q = k = v = 0, g = 0, beta = 0: an exact identity step (S unchanged, o_t = 0).
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    q = q.reshape(B, H, N, C, Dk)
    k = k.reshape(B, H, N, C, Dk)
    v = v.reshape(B, H, N, C, Dv)
    g = g.reshape(B, H, N, C)
    beta = beta.reshape(B, H, N, C)

    G = g.cumsum(-1)  # (B, H, N, C) local cumulative log-decay
    idx = torch.arange(C, device=q.device)
    incl = idx[:, None] >= idx[None, :]  # j <= t
    strict = idx[:, None] > idx[None, :]  # j < t
    # seg[t, j] = g_{j+1} + ... + g_t = G_t - G_j for j <= t, summed directly ("segment
    # sum") rather than as a difference of cumsums, which loses digits when G is large.
    seg = g.unsqueeze(-1).expand(*g.shape, C).masked_fill(~strict, 0.0).cumsum(-2)
    # seg is 0 above the diagonal; -inf there makes exp exactly 0 (with zero gradient).
    decay = torch.exp(seg.masked_fill(~incl, float("-inf")))  # D[t, j] <= 1
    eG = torch.exp(G)

    # Per step (Dk, Dv layout): S_t = e^{g_t} S_{t-1} + k_t u_tᵀ with the write
    # u_t = beta_t (v_t - (e^{g_t} S_{t-1})ᵀ k_t). Inside a chunk from S0,
    # e^{g_t} S_{t-1} = e^{G_t} S0 + sum_{j<t} D[t, j] k_j u_jᵀ, so the writes solve the
    # unit lower-triangular system (the WY form)
    #   (I + A) U = beta ⊙ V - (beta e^{G} ⊙ K) S0,   A[t, j] = beta_t D[t, j] k_t·k_j (j < t),
    # solved once for [beta V | beta e^G K]: U = Uv - Wk S0 for whatever S0 the chunk starts at.
    A = _mm(k, k.transpose(-1, -2), md) * decay.masked_fill(~strict, 0.0) * beta.unsqueeze(-1)
    rhs = torch.cat([beta.unsqueeze(-1) * v, (beta * eG).unsqueeze(-1) * k], dim=-1)
    # (I + A) X = rhs; unitriangular=True uses the implicit unit diagonal of I + A.
    X = _solve_unit_lower(A, rhs)
    Uv, Wk = X[..., :Dv], X[..., Dv:]  # U = Uv - Wk @ S0

    # o_t = S_tᵀ q_t = (e^{G_t} q_t)ᵀ S0 + sum_{j<=t} D[t, j] (q_t·k_j) u_j, and the chunk's
    # end state S_C = e^{G_C} S0 + sum_j e^{G_C - G_j} k_j u_jᵀ
    attn = (_mm(q, k.transpose(-1, -2), md) * decay).to(md)  # (B, H, N, C, C)
    qg = (q * eG.unsqueeze(-1)).to(md)  # reads the chunk's start state
    kd = k * decay[..., -1, :].unsqueeze(-1)  # exp(G_C - G_j): writes into the end state
    eGC = torch.exp(G[..., -1])  # (B, H, N) whole-chunk decay

    # unbind (not per-chunk indexing): the backward of x[:, :, n] would allocate and fill a
    # full-size zero gradient per chunk, which makes backward quadratic in N.
    kdT, Wk = kd.transpose(-1, -2).to(md), Wk.to(md)
    per_chunk = zip(*(x.unbind(2) for x in (Uv, Wk, qg, attn, kdT, eGC[..., None, None])))
    outs = []
    for Uv_n, Wk_n, qg_n, attn_n, kdT_n, eGC_n in per_chunk:  # the state S in the gates' dtype
        U = Uv_n - _mm(Wk_n, S, md)
        outs.append(_mm(qg_n, S, md).to(S.dtype) + _mm(attn_n, U, md))
        S = eGC_n * S + _mm(kdT_n, U, md)
    if outs:
        o = torch.stack(outs, dim=2).reshape(B, H, N * C, Dv)[:, :, :T]
    else:
        o = v.new_zeros(B, H, 0, Dv)
    return o, S
