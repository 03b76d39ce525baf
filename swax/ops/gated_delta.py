r"""Gated delta rule (Gated DeltaNet) as plain PyTorch tensor functions.

Math
----
Per batch element and head, with a state ``S`` of shape ``(Dk, Dv)`` and, at step ``t``,
a key ``k_t`` and query ``q_t`` (``Dk``, L2-normalised by the caller), a value ``v_t``
(``Dv``), a log-decay ``g_t <= 0`` and a write strength ``beta_t`` in ``(0, 1)``::

    S   <- S * exp(g_t)                       # decay
    u_t  = beta_t * (v_t - S^T k_t)           # delta: what the memory gets wrong about k_t
    S   <- S + k_t u_t^T                      # rank-one correction
    o_t  = S^T (scale * q_t)                  # read with the updated state

i.e. ``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`` in the
``(Dk, Dv)`` layout (the transpose of ``S_t = S_{t-1} exp(g_t)(I - beta_t k_t k_t^T) +
beta_t v_t k_t^T`` written with ``(Dv, Dk)`` states). This is exactly fla's
``naive_recurrent_gated_delta_rule``; ``scale`` defaults to ``Dk ** -0.5``.

Chunkwise (WY / UT) form, used by ``mode="chunk"``: split time into chunks of ``C`` steps.
Inside a chunk with start state ``S0`` let ``G_t = g_1 + ... + g_t`` (local cumulative
log-decay, so ``G_t - G_j <= 0`` for ``j <= t``). Unrolling the recurrence gives
``S_t = exp(G_t) S0 + sum_{j<=t} exp(G_t - G_j) k_j u_j^T`` and therefore::

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

Backends of ``mode="chunk"`` (chosen through :mod:`swax.ops.registry`, op name
``"gated_delta"``):

* ``fla`` (CUDA, ``flash-linear-attention`` installed, bfloat16/float16 inputs): fla's Triton
  ``chunk_gated_delta_rule``. Conventions adapted: fla takes ``(B, T, H, D)`` tensors (we
  transpose), its own L2-norm is off (``use_qk_l2norm_in_kernel=False``: the op's q, k are
  normalised by the caller), ``scale`` is passed through, ``g`` is the same per-step log-decay,
  states are ``(B, H, Dk, Dv)`` float32 as here. ``beta`` is passed in the input dtype (as fla's
  own layer does) and the kernel's tiles are in the input dtype, so the two agree to bfloat16
  precision, not float32; fla always uses chunks of 64 (``chunk_size`` is ignored).
* ``native`` (any device): the chunkwise form below, differentiated by autograd.

Precision: inputs may be float32 or bfloat16 (or float16); the math runs in float32 and the
returned state is float32. Float64 inputs are computed in float64 (state float64 too), which
lets tests check the chunk algebra to round-off and run ``torch.autograd.gradcheck``.
Backward is plain autograd through both modes (the chunk mode's graph holds ``C × C`` tiles per
chunk, never ``T × T``, and loops over chunks, never over time steps).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F

from swax.ops.checks import (
    check_choice,
    check_floating,
    check_ndim,
    check_positive_int,
    check_shape,
)
from swax.ops.packing import by_document, check_doc_ids
from swax.ops.registry import list_backends, register_backend, select_backend
from swax.ops.triton_env import device_problem, unusable_install

__all__ = ["gated_delta_rule", "gated_delta_step"]

_MODES = ("chunk", "recurrent")


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def _compute_dtype(*xs: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def _resolve_scale(scale: float | None, dk: int, fn: str) -> float:
    if scale is None:
        return dk**-0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{fn}: scale must be a finite number or None, got {scale!r}")
    return float(scale)


def _check_state(name: str, state: torch.Tensor | None, expected: tuple[int, ...], fn: str) -> None:
    if state is not None:
        check_floating(fn, **{name: state})
        check_shape(fn, name, state, expected, "(B, H, Dk, Dv)")


def _check_sequence_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    fn: str,
) -> None:
    """q, k (B, H, T, Dk), v (B, H, T, Dv), g, beta (B, H, T)."""
    check_floating(fn, q=q, k=k, v=v, g=g, beta=beta)
    check_ndim(fn, "q", q, 4, "(B, H, T, Dk)")
    check_shape(fn, "k", k, q.shape, "the shape of q (B, H, T, Dk)")
    check_ndim(fn, "v", v, 4, "(B, H, T, Dv)")
    check_shape(fn, "v", v, (*q.shape[:3], v.shape[-1]), "(B, H, T, Dv) from q")
    for name, x in (("g", g), ("beta", beta)):
        check_shape(fn, name, x, q.shape[:3], "(B, H, T) from q")


def _recurrent_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    beta_t: torch.Tensor,
    S: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step in compute dtype. q_t, k_t: (B,H,Dk) (q_t scaled); v_t: (B,H,Dv);
    g_t, beta_t: (B,H); S: (B,H,Dk,Dv). Returns (o_t (B,H,Dv), new S). Out of place."""
    S = S * torch.exp(g_t)[..., None, None]
    kS = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # S^T k_t: (B, H, Dv)
    u = (v_t - kS) * beta_t.unsqueeze(-1)
    S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)
    o_t = (q_t.unsqueeze(-2) @ S).squeeze(-2)
    return o_t, S


def _recurrent(q, k, v, g, beta, S):
    T = q.shape[2]
    outs = []
    for t in range(T):
        o_t, S = _recurrent_step(q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t], S)
        outs.append(o_t)
    if outs:
        o = torch.stack(outs, dim=2)
    else:
        o = q.new_zeros(*q.shape[:3], v.shape[-1])
    return o, S


def _chunk(q, k, v, g, beta, S, chunk_size: int):
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
    A = (k @ k.transpose(-1, -2)) * decay.masked_fill(~strict, 0.0) * beta.unsqueeze(-1)
    rhs = torch.cat([beta.unsqueeze(-1) * v, (beta * eG).unsqueeze(-1) * k], dim=-1)
    # (I + A) X = rhs; unitriangular=True uses the implicit unit diagonal of I + A.
    X = _solve_unit_lower(A, rhs)
    Uv, Wk = X[..., :Dv], X[..., Dv:]  # U = Uv - Wk @ S0

    # o_t = S_tᵀ q_t = (e^{G_t} q_t)ᵀ S0 + sum_{j<=t} D[t, j] (q_t·k_j) u_j, and the chunk's
    # end state S_C = e^{G_C} S0 + sum_j e^{G_C - G_j} k_j u_jᵀ
    attn = (q @ k.transpose(-1, -2)) * decay  # (B, H, N, C, C)
    qg = q * eG.unsqueeze(-1)  # reads the chunk's start state
    kd = k * decay[..., -1, :].unsqueeze(-1)  # exp(G_C - G_j): writes into the end state
    eGC = torch.exp(G[..., -1])  # (B, H, N) whole-chunk decay

    # unbind (not per-chunk indexing): the backward of x[:, :, n] would allocate and fill a
    # full-size zero gradient per chunk, which makes backward quadratic in N.
    kdT = kd.transpose(-1, -2)
    per_chunk = zip(*(x.unbind(2) for x in (Uv, Wk, qg, attn, kdT, eGC[..., None, None])))
    outs = []
    for Uv_n, Wk_n, qg_n, attn_n, kdT_n, eGC_n in per_chunk:
        U = Uv_n - Wk_n @ S
        outs.append(qg_n @ S + attn_n @ U)
        S = eGC_n * S + kdT_n @ U
    if outs:
        o = torch.stack(outs, dim=2).reshape(B, H, N * C, Dv)[:, :, :T]
    else:
        o = v.new_zeros(B, H, 0, Dv)
    return o, S


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    mode: str = "chunk",
    chunk_size: int = 64,
    scale: float | None = None,
    backend: str | None = None,
    doc_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule over a sequence (fla's ``naive_recurrent_gated_delta_rule``).

    Args:
        q: ``(B, H, T, Dk)`` queries, L2-normalised over ``Dk`` by the caller.
        k: ``(B, H, T, Dk)`` keys, L2-normalised over ``Dk`` by the caller.
        v: ``(B, H, T, Dv)`` values.
        g: ``(B, H, T)`` log-decay, ``<= 0`` (the state is multiplied by ``exp(g)``).
        beta: ``(B, H, T)`` write strength in ``(0, 1)``.
        initial_state: ``(B, H, Dk, Dv)`` state before the first step, or None for zeros.
            Never modified; gradients flow into it.
        output_final_state: return the state after the last step (else None).
        mode: ``"chunk"`` (chunkwise WY form, for training and prefill) or
            ``"recurrent"`` (a loop over time steps; the reference).
        chunk_size: steps per chunk in ``"chunk"`` mode; any ``T`` is accepted.
        scale: multiplies ``q``; default ``Dk ** -0.5``.
        backend: implementation of ``mode="chunk"``: None/"auto" (the best usable one),
            "fla" or "native" (see the module docstring). A backend that cannot run on these
            inputs falls back to the automatic choice, with a warning logged once. The
            recurrent mode is the reference and ignores it.
        doc_ids: ``(B, T)`` document index of each token (packed documents, see
            :mod:`swax.ops.packing`): the state restarts from zero at each document start, and the
            final state is that of each row's last document. Not with an ``initial_state``.

    Returns:
        ``o``: ``(B, H, T, Dv)`` in q's dtype, and the final state ``(B, H, Dk, Dv)``
        (float32; float64 for float64 inputs) or None.

    Raises:
        ValueError: wrong ndim or mismatched shapes, unknown ``mode`` or ``backend``,
            ``chunk_size <= 0``, or an ``initial_state`` of the wrong shape.
    """
    fn = "gated_delta_rule"
    _check_sequence_inputs(q, k, v, g, beta, fn)
    check_choice(fn, "mode", mode, _MODES)
    check_positive_int(fn, "chunk_size", chunk_size)
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    _check_state("initial_state", initial_state, (B, H, Dk, Dv), fn)
    scale = _resolve_scale(scale, Dk, fn)
    if doc_ids is not None and T > 0:
        check_doc_ids(doc_ids, B, T, fn)
        if initial_state is not None:
            raise ValueError(f"{fn}: doc_ids cannot be combined with an initial_state")

        def op(q, k, v, g, beta, init, out_state):
            return gated_delta_rule(q, k, v, g, beta, init, out_state, mode, chunk_size, scale,
                                    backend)  # fmt: skip

        # padding: decay exp(0) = 1 and write strength 0 leave the state as it is
        neutral = (0.0, 0.0, 0.0, 0.0, 0.0)
        return by_document(op, (q, k, v, g, beta), neutral, doc_ids, chunk_size,
                           output_final_state)  # fmt: skip

    if mode == "chunk" and T > 0:
        impl = select_backend("gated_delta", backend, q, k, v, g, beta, initial_state)
        o, S = impl.fn(q, k, v, g, beta, initial_state, output_final_state, chunk_size, scale)
        return o, (S if output_final_state else None)
    if backend not in (None, "auto") and backend not in list_backends("gated_delta"):
        raise ValueError(
            f"{fn}: unknown backend {backend!r}; expected one of "
            f"{['auto', *list_backends('gated_delta')]}"
        )
    o, S = _native(q, k, v, g, beta, initial_state, output_final_state, chunk_size, scale, mode)
    return o, (S if output_final_state else None)


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


def _native(q, k, v, g, beta, initial_state, output_final_state, chunk_size, scale, mode="chunk"):
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    out_dtype = q.dtype
    cd = _compute_dtype(q, k, v)
    q, k, v, g, beta = (x.to(cd) for x in (q, k, v, g, beta))
    q = q * scale
    if initial_state is None:
        S = q.new_zeros(B, H, Dk, Dv)
    else:
        S = initial_state.to(cd)

    if mode == "recurrent":
        o, S = _recurrent(q, k, v, g, beta, S)
    else:
        o, S = _chunk(q, k, v, g, beta, S, chunk_size)
    return o.to(out_dtype), S


@lru_cache(maxsize=1)
def _fla_chunk():
    """fla's chunk kernel, or the reason it cannot be imported (imported on first use only)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - missing package, triton, or a broken install
        missing = isinstance(e, ModuleNotFoundError) and e.name in ("fla", "triton")
        why = f"flash-linear-attention is not available ({type(e).__name__}: {e})"
        return None, unusable_install("gated_delta 'fla'", why, missing)
    return chunk_gated_delta_rule, None


def _fla_environment(device: str | None) -> str | None:
    return device_problem(device) or _fla_chunk()[1]


def _fla_usable(q, k, v, g, beta, initial_state=None):
    """None when fla's kernel takes these inputs (its environment checked before)."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"fla's chunk kernel needs bfloat16/float16 inputs, got {q.dtype}"
    if q.shape[-1] > 256 or v.shape[-1] > 256:
        return f"fla's chunk kernel needs head dims <= 256, got Dk={q.shape[-1]}, Dv={v.shape[-1]}"
    return None


def _fla(q, k, v, g, beta, initial_state, output_final_state, chunk_size, scale):
    kernel, _ = _fla_chunk()
    dt = q.dtype
    S0 = None if initial_state is None else initial_state.float()
    o, S = kernel(
        q.transpose(1, 2),
        k.to(dt).transpose(1, 2),
        v.to(dt).transpose(1, 2),
        g.float().transpose(1, 2),
        beta.to(dt).transpose(1, 2),
        scale=scale,
        initial_state=S0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=False,
    )
    return o.transpose(1, 2).to(dt), (S.float() if S is not None else S)


register_backend(
    "gated_delta",
    "fla",
    _fla,
    _fla_usable,
    priority=20,
    doc="fla's chunk_gated_delta_rule (Triton); CUDA, bfloat16/float16",
    environment=_fla_environment,
    packages=("flash-linear-attention", "triton"),
    guard_first_call=True,
)
register_backend(
    "gated_delta",
    "native",
    lambda *a: _native(*a, mode="chunk"),
    priority=10,
    doc="chunkwise WY form in PyTorch, autograd backward; any device",
)


def gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of the gated delta rule.

    Accepts either a single time step without a time axis or with a time axis of length 1:

    - ``q, k``: ``(B, H, Dk)``; ``v``: ``(B, H, Dv)``; ``g, beta``: ``(B, H)``
      -> ``o``: ``(B, H, Dv)``; or
    - ``q, k``: ``(B, H, 1, Dk)``; ``v``: ``(B, H, 1, Dv)``; ``g, beta``: ``(B, H, 1)``
      -> ``o``: ``(B, H, 1, Dv)``.

    ``state`` is ``(B, H, Dk, Dv)`` (None means zeros) and is not modified; the new state
    (float32; float64 for float64 inputs) is returned. ``o`` has q's dtype; ``scale``
    defaults to ``Dk ** -0.5``. Same math as one step of :func:`gated_delta_rule`.
    """
    fn = "gated_delta_step"
    check_floating(fn, q=q, k=k, v=v, g=g, beta=beta)
    if q.ndim == 4:
        if q.shape[2] != 1:
            raise ValueError(
                f"{fn}: q has shape {_shape(q)} with T={q.shape[2]}, expected T=1 for one "
                "step (use gated_delta_rule for sequences)"
            )
        _check_sequence_inputs(q, k, v, g, beta, fn)
        squeeze = True
        q, k, v, g, beta = q[:, :, 0], k[:, :, 0], v[:, :, 0], g[:, :, 0], beta[:, :, 0]
    elif q.ndim == 3:
        squeeze = False
        check_shape(fn, "k", k, q.shape, "the shape of q (B, H, Dk)")
        check_ndim(fn, "v", v, 3, "(B, H, Dv)")
        check_shape(fn, "v", v, (*q.shape[:2], v.shape[-1]), "(B, H, Dv) from q")
        for name, x in (("g", g), ("beta", beta)):
            check_shape(fn, name, x, q.shape[:2], "(B, H) from q")
    else:
        raise ValueError(
            f"{fn}: q must be (B, H, Dk) or (B, H, 1, Dk), got ndim={q.ndim} with shape {_shape(q)}"
        )
    B, H, Dk = q.shape
    Dv = v.shape[-1]
    _check_state("state", state, (B, H, Dk, Dv), fn)
    scale = _resolve_scale(scale, Dk, fn)

    out_dtype = q.dtype
    cd = _compute_dtype(q, k, v)
    q, k, v, g, beta = (x.to(cd) for x in (q, k, v, g, beta))
    S = q.new_zeros(B, H, Dk, Dv) if state is None else state.to(cd)
    o, S = _recurrent_step(q * scale, k, v, g, beta, S)
    o = o.to(out_dtype)
    return (o.unsqueeze(2) if squeeze else o), S
