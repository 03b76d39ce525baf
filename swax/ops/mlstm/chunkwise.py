r"""Chunkwise mLSTM kernel with a hand-written backward (the ``native`` backend of ``mlstm``).

Computes exactly the function of :func:`swax.ops.mlstm.mlstm` (see the package docstring) on a
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
k (see ``chunkwise_fwd._SPREAD`` for when that is exact and what happens otherwise).

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

Files: this one holds the custom ops, their autograd registration, :func:`mlstm_chunkwise` and
the ``native`` backend around it; :mod:`swax.ops.mlstm.chunkwise_fwd` the gate bookkeeping, the
tiles and the forward; :mod:`swax.ops.mlstm.chunkwise_bwd` the backward.
"""

from __future__ import annotations

import torch

from swax.ops.mlstm.chunkwise_bwd import _bwd_impl
from swax.ops.mlstm.chunkwise_fwd import _fwd_impl
from swax.ops.precision import autocast_off, products_dtype

__all__ = ["mlstm_chunkwise", "native_backend"]


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
    with torch.no_grad(), autocast_off(q):
        return _fwd_impl(q, k, v, i, f, C0, n0, m0, chunk_size, scale, eps)


@_fwd_op.register_fake
def _(q, k, v, i, f, C0, n0, m0, chunk_size, scale, eps):
    B, H, T, D = q.shape
    Dv = v.shape[-1]
    N = T // chunk_size
    return (  # h and the states in the compute dtype (C0's), vx in v's
        C0.new_empty(B, H, T, Dv),
        C0.new_empty(B, H, D, Dv),
        C0.new_empty(B, H, D),
        C0.new_empty(B, H),
        C0.new_empty(B, H, T),
        C0.new_empty(B, H, N, D, Dv + 1),
        C0.new_empty(B, H, D, Dv + 1),
        v.new_empty(B, H, N, chunk_size, Dv + 1),
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
    with torch.no_grad(), autocast_off(q):
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
        vx.new_empty(h.shape),
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
    for gradient checks), except that q, k, v may be bfloat16 with the rest float32: the
    products then take bfloat16 operands (:mod:`swax.ops.precision`). q unscaled (multiplied by
    ``scale`` inside).

    Returns ``h`` (B, H, T, Dv) and the final state ``(C, n, m)`` in the gates' dtype;
    differentiable in every input, including the initial state.
    """
    T = q.shape[2]
    if T % chunk_size:
        raise ValueError(f"mlstm_chunkwise: T={T} is not a multiple of chunk_size={chunk_size}")
    args = [x.contiguous() for x in (q, k, v, i, f, C0, n0, m0)]
    h, C, n, m, _, _, _, _ = _fwd_op(*args, chunk_size, float(scale), float(eps))
    return h, (C, n, m)


def native_backend(q, k, v, i, f, state, chunk_size, eps):
    """Full chunks of ``chunk_size`` steps in one kernel call, the shorter tail in a second
    call continuing from the first one's state."""
    T, Dqk = q.shape[2], q.shape[3]
    L = min(chunk_size, T)
    cut = T // L * L
    md = products_dtype(q)  # bfloat16 tiles for bfloat16 inputs, else float32 throughout
    xs = [x.to(md) for x in (q, k, v)] + [x.float() for x in (i, f)]
    C, n, m = state
    pieces = []
    for lo, hi in ((0, cut), (cut, T)):
        if hi > lo:
            h, (C, n, m) = mlstm_chunkwise(
                *(x[:, :, lo:hi] for x in xs), C, n, m, min(L, hi - lo), Dqk**-0.5, eps
            )
            pieces.append(h)
    h = torch.cat(pieces, 2) if len(pieces) > 1 else pieces[0]
    return h, (C, n, m)
