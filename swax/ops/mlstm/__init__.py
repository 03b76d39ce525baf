r"""The mLSTM cell (xLSTM-7B formulation) as pure tensor functions.

Shapes follow ``scaled_dot_product_attention``: ``q, k`` are ``(B, H, T, Dqk)``, ``v`` is
``(B, H, T, Dv)``, the gate pre-activations ``i, f`` are ``(B, H, T)``.

The cell, per batch element and head, for t = 1 … T::

    log f_t = logsigmoid(f_t)
    m_t     = max(log f_t + m_{t-1}, i_t)                    # stabiliser
    f'_t    = exp(log f_t + m_{t-1} - m_t)
    i'_t    = exp(i_t - m_t)
    C_t     = f'_t C_{t-1} + i'_t k_t v_tᵀ                   # (Dqk, Dv)
    n_t     = f'_t n_{t-1} + i'_t k_t                        # (Dqk,)
    q̃_t     = q_t · Dqk^-1/2
    h_t     = C_tᵀ q̃_t / (max(|n_tᵀ q̃_t|, exp(-m_t)) + eps)

The state is ``(C, n, m)`` with shapes ``(B, H, Dqk, Dv)``, ``(B, H, Dqk)``, ``(B, H)``,
always float32. ``C`` and ``n`` are stored *stabilised*: the unstabilised memory is
``exp(m) · C``. The empty state is ``C = 0, n = 0, m = -inf``; with it the recurrence equals
the parallel form of ``mlstm_kernels`` (``parallel--native_autograd``), whose ``m_t`` is the
row maximum of the log-decay matrix

    log D_{t,j} = Σ_{j<s≤t} log f_s + i_j      (j ≤ t),

because unrolling the max-recurrence gives ``m_t = max(m_0 + Σ_{s≤t} log f_s, max_j log D_{t,j})``.

Three modes compute the same function:

* ``parallel``: the quadratic form above, one ``T × T`` matrix (a reference).
* ``chunk``: chunkwise-parallel. Within a chunk of ``L`` steps the outputs are the
  quadratic form plus the contribution of the state at the chunk start; chunk-end states
  are carried by a loop over chunks. Memory is ``O(T · L)``; any ``T`` works (the last,
  shorter chunk is processed unpadded, so nothing leaks into the final state).
* ``recurrent``: a loop over time calling :func:`mlstm_step` (decode and reference).

Backends of ``mode="chunk"`` (chosen through :mod:`swax.ops.registry`, op name ``"mlstm"``):

* ``triton`` (CUDA, ``mlstm_kernels`` installed): mlstm_kernels' ``chunkwise--triton_xl_chunk``
  on the longest prefix it accepts (a multiple of 128 steps, or 16/32/64), ``native`` on the
  rest. Its conventions are adapted: states in and out are ``(C, n, m)`` with ``m`` of shape
  (B, H), and the returned final state is re-stabilised to the ``m_0 = -inf`` convention
  used here (the kernel starts an empty state from ``m_0 = 0``). Residual difference: from an
  empty state the kernel's denominator is ``max(|nᵀq̃|, exp(-m'_t)) + eps`` with
  ``m'_t = max(m_t, Σ_{s<=t} log f_s)``, which changes ``h`` by at most ``eps`` relative.
  bfloat16/float16 inputs are passed to the kernel as they are (float32 accumulation, tiles
  in the input dtype); other dtypes run in float32. The kernel does not backpropagate into
  the initial ``n, m`` nor from the final ``n, m``, so ``"auto"`` takes ``native`` for calls
  that need those gradients (naming ``triton`` there is an error).
  **Gradients.** mlstm_kernels' backward is the gradient with the denominator and the
  stabiliser held constant (dq, dk, di, df off by ~100% against the cell; dv exact; the same
  as NX-AI/mlstm_kernels issue #16). Where gradients are needed, this backend restores the
  missing terms (:func:`swax.ops.mlstm.triton._triton_with_true_grad`; the adapter is in
  :mod:`swax.ops.mlstm.triton`): one extra value column of ones (16 columns, the kernel's
  granularity) gives the kernel's own ``nᵀq̃ / den`` and its gradient, and a
  gradient-free forward (mlstm_kernels' forward function, which also returns each step's
  ``max(|nᵀq̃|, exp(-m))`` and m) says which side of that max each step is on; the sequence
  is padded at the end to the kernel's lengths instead of finishing on ``native``. Cost:
  Dv + 16 value columns, plus a forward with 16. (Should that function not import, an
  ``eps = 0`` call on the ones column reads the side instead, to within 2^-8 on CUDA.)
* ``native`` (any device; the CPU default): :mod:`swax.ops.mlstm.chunkwise`, a chunkwise
  kernel with a hand-written backward that recomputes the intra-chunk tiles instead of
  saving them; registered as ``torch.library`` custom ops, so ``torch.compile`` keeps it.
* ``autograd``: the chunkwise form (``parallel.py``), differentiated by autograd (a reference).

All arithmetic is float32 whatever the input dtype, except the matrix products of bfloat16
inputs in the ``native`` kernel (bfloat16 tiles, float32 accumulation; the gates' float64
bookkeeping, the states and the denominator as for float32: :mod:`swax.ops.precision`) and the
bfloat16/float16 tiles inside the Triton kernel; ``h`` is returned in ``q``'s dtype.
Log-decays inside a chunk are formed as segment sums of ``log f`` (never as differences of
a long cumulative sum), so very long sequences processed with state passing keep full
precision.

Files: this ``__init__`` holds the dispatch (:func:`mlstm`, :func:`mlstm_step`, their input
checks) and registers the backends; ``recurrent.py`` the state and the step (``recurrent``
mode, decode); ``parallel.py`` the quadratic and chunkwise forms in autograd (``parallel``
mode, the ``autograd`` backend); ``chunkwise.py`` (with ``chunkwise_fwd.py`` and
``chunkwise_bwd.py``) the ``native`` kernel; ``triton.py`` the adapter to mlstm_kernels.
(``swax.ops.mlstm`` as an attribute of :mod:`swax.ops` is the function; import the files as
``from swax.ops.mlstm import chunkwise``, not ``import swax.ops.mlstm.chunkwise as …``.)
"""

from __future__ import annotations

import torch

from swax.ops.checks import (
    check_choice,
    check_floating,
    check_ndim,
    check_positive_int,
    check_shape,
)
from swax.ops.mlstm.chunkwise import native_backend
from swax.ops.mlstm.parallel import _autograd_chunks, autograd_backend
from swax.ops.mlstm.recurrent import State, _init_state, _step, recurrent
from swax.ops.mlstm.triton import triton_backend, triton_environment, triton_usable
from swax.ops.packing import by_document, check_doc_ids
from swax.ops.precision import autocast_off
from swax.ops.registry import list_backends, register_backend, select_backend

MODES = ("parallel", "chunk", "recurrent")

__all__ = ["mlstm", "mlstm_step", "MODES", "State"]


# --------------------------------------------------------------------------- validation


def _check_state(state: object, B: int, H: int, Dqk: int, Dv: int, what: str, fn: str) -> None:
    if not isinstance(state, (tuple, list)) or len(state) != 3:
        got = type(state).__name__
        if isinstance(state, (tuple, list)):
            got += f" of length {len(state)}"
        raise ValueError(f"{fn}: {what} must be a tuple (C, n, m), got {got}")
    expected = {"C": (B, H, Dqk, Dv), "n": (B, H, Dqk), "m": (B, H)}
    layouts = {"C": "(B, H, Dqk, Dv)", "n": "(B, H, Dqk)", "m": "(B, H)"}
    for (name, shape), x in zip(expected.items(), state):
        check_floating(fn, **{f"{what} {name}": x})
        check_shape(fn, f"{what} {name}", x, shape, layouts[name])


def _check_inputs(q, k, v, i, f, seq: bool) -> None:
    """q, k (B, H, T, Dqk), v (B, H, T, Dv), i, f (B, H, T); without T for a step."""
    fn = "mlstm" if seq else "mlstm_step"
    check_floating(fn, q=q, k=k, v=v, i=i, f=f)
    lead = "(B, H, T" if seq else "(B, H"
    check_ndim(fn, "q", q, 4 if seq else 3, f"{lead}, Dqk)")
    check_ndim(fn, "v", v, 4 if seq else 3, f"{lead}, Dv)")
    check_shape(fn, "k", k, q.shape, f"q's shape {lead}, Dqk)")
    check_shape(fn, "v", v, (*q.shape[:-1], v.shape[-1]), f"{lead}, Dv) from q")
    for name, x in (("i", i), ("f", f)):
        check_shape(fn, name, x, q.shape[:-1], f"{lead}) from q")


def mlstm(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    initial_state: State | None = None,
    output_final_state: bool = False,
    mode: str = "chunk",
    chunk_size: int = 64,
    eps: float = 1e-6,
    backend: str | None = None,
    doc_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, State | None]:
    """mLSTM over a sequence (see the module docstring for the math).

    Args:
        q, k: (B, H, T, Dqk) queries and keys (q is scaled by Dqk^-1/2 inside).
        v: (B, H, T, Dv) values.
        i, f: (B, H, T) input- and forget-gate pre-activations.
        initial_state: None (empty state: C=0, n=0, m=-inf) or (C, n, m) with shapes
            (B, H, Dqk, Dv), (B, H, Dqk), (B, H); cast to float32, never modified.
        output_final_state: return the state after step T (else None).
        mode: "chunk" (chunkwise-parallel, O(T·chunk_size) memory), "parallel"
            (quadratic reference) or "recurrent" (loop over time).
        chunk_size: chunk length for mode="chunk"; any T is accepted.
        eps: added to the denominator of h.
        backend: implementation of mode="chunk": None/"auto" (the best usable one),
            "triton", "native" or "autograd" (see the module docstring). A backend named
            that cannot run on these inputs is a BackendUnavailableError (a ValueError) with
            the reason; "auto" falls back. The other modes are references and ignore it.
        doc_ids: (B, T) document index of each token (packed documents, see
            :mod:`swax.ops.packing`): the state restarts from empty at each document start, and
            the final state is that of each row's last document. Not with an initial_state.

    Returns:
        h: (B, H, T, Dv) in q's dtype, and the final state (C, n, m), float32, or None.

    Raises:
        ValueError: on mismatched shapes, wrong ndim, unknown mode or backend,
            chunk_size <= 0 or an initial_state of the wrong shapes.
    """
    _check_inputs(q, k, v, i, f, seq=True)
    check_choice("mlstm", "mode", mode, list(MODES))
    check_positive_int("mlstm", "chunk_size", chunk_size)
    B, H, T, Dqk = q.shape
    Dv = v.shape[-1]
    if initial_state is not None:
        _check_state(initial_state, B, H, Dqk, Dv, "initial_state", "mlstm")
    if doc_ids is not None:
        rest = (output_final_state, mode, chunk_size, eps, backend, initial_state, doc_ids)
        return _by_document(q, k, v, i, f, *rest)
    state = _init_state(initial_state, B, H, Dqk, Dv, q.device)

    out_dtype = q.dtype
    if mode == "chunk" and T > 0:
        impl = select_backend("mlstm", backend, q, k, v, i, f, initial_state, output_final_state)
        with autocast_off(q):  # the kernels choose their dtypes (swax.ops.precision)
            h, state = impl.fn(q, k, v, i, f, state, chunk_size, eps)
        return h.to(out_dtype), (state if output_final_state else None)
    if backend not in (None, "auto") and backend not in list_backends("mlstm"):
        raise ValueError(
            f"mlstm: unknown backend {backend!r}; expected one of "
            f"{['auto', *list_backends('mlstm')]}"
        )
    qf = q.float() * Dqk**-0.5
    kf, vf, i_f = k.float(), v.float(), i.float()

    with autocast_off(q):
        if mode == "recurrent" or T == 0:
            h, state = recurrent(qf, kf, vf, i_f, f, state, eps)
        else:
            h, state = _autograd_chunks(qf, kf, vf, i_f, f, state, T, eps)
    return h.to(out_dtype), (state if output_final_state else None)


_IGATE_OFF, _FGATE_KEEP = -1.0e4, 1.0e4  # padding: i = exp(-1e4 - m) = 0, f = sigmoid(1e4) = 1


def _by_document(q, k, v, i, f, want_state, mode, chunk_size, eps, backend, initial_state, doc_ids):
    """mlstm on each packed document alone (swax.ops.packing.by_document)."""
    B, _, T, _ = q.shape
    check_doc_ids(doc_ids, B, T, "mlstm")
    if initial_state is not None:
        raise ValueError("mlstm: doc_ids cannot be combined with an initial_state")
    if T == 0:
        return mlstm(q, k, v, i, f, None, want_state, mode, chunk_size, eps, backend)

    def op(q, k, v, i, f, init, out_state):
        return mlstm(q, k, v, i, f, init, out_state, mode, chunk_size, eps, backend)

    neutral = (0.0, 0.0, 0.0, _IGATE_OFF, _FGATE_KEEP)
    return by_document(op, (q, k, v, i, f), neutral, doc_ids, chunk_size, want_state)


def _triton_backend(q, k, v, i, f, state, chunk_size, eps):
    """mlstm_kernels' Triton kernel (:mod:`swax.ops.mlstm.triton`), native on the tail."""
    return triton_backend(q, k, v, i, f, state, chunk_size, eps, rest=native_backend)


register_backend(
    "mlstm",
    "triton",
    _triton_backend,
    triton_usable,
    priority=20,
    doc="mlstm_kernels chunkwise--triton_xl_chunk (+ native on the tail); CUDA",
    environment=triton_environment,
    packages=("mlstm_kernels", "triton"),
    guard_first_call=True,
)
register_backend(
    "mlstm",
    "native",
    native_backend,
    priority=10,
    doc="chunkwise kernel with a hand-written backward; any device",
)
register_backend(
    "mlstm",
    "autograd",
    autograd_backend,
    priority=0,
    doc="chunkwise form differentiated by autograd; a reference",
)


def mlstm_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    state: State | None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, State]:
    """One mLSTM decode step.

    Args:
        q, k: (B, H, Dqk); v: (B, H, Dv); i, f: (B, H) gate pre-activations.
        state: (C, n, m) with shapes (B, H, Dqk, Dv), (B, H, Dqk), (B, H), or None for
            the empty state. Never modified.
        eps: added to the denominator of h.

    Returns:
        h: (B, H, Dv) in q's dtype, and the new state (C, n, m), float32.
    """
    _check_inputs(q, k, v, i, f, seq=False)
    B, H, Dqk = q.shape
    Dv = v.shape[-1]
    if state is not None:
        _check_state(state, B, H, Dqk, Dv, "state", "mlstm_step")
    state = _init_state(state, B, H, Dqk, Dv, q.device)
    h, state = _step(q.float() * Dqk**-0.5, k.float(), v.float(), i.float(), f.float(), state, eps)
    return h.to(q.dtype), state
