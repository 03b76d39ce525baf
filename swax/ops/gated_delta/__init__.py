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

The chunkwise (WY / UT) form used by ``mode="chunk"`` — chunks of ``C`` steps, a
unit-lower-triangular solve per chunk independent of the state, only the state carried chunk to
chunk, every exponent ``<= 0``, memory ``O(T * C)``, never ``T x T`` — is derived in
``chunk.py``.

Backends of ``mode="chunk"`` (chosen through :mod:`swax.ops.registry`, op name
``"gated_delta"``):

* ``fla`` (CUDA, ``flash-linear-attention`` installed, bfloat16/float16 inputs): fla's Triton
  ``chunk_gated_delta_rule``, its conventions adapted (``fla.py`` says how). Its tiles are in
  the input dtype, so it agrees with ``native`` to bfloat16 precision, not float32; it always
  uses chunks of 64 (``chunk_size`` is ignored).
* ``native`` (any device): the chunkwise form (``chunk.py``), differentiated by autograd.

Precision: inputs may be float32 or bfloat16 (or float16); the math runs in float32 and the
returned state is float32, except that the chunk form's matrix products take bfloat16 tiles of
bfloat16 q, k, v (float32 accumulation; the gates, the triangular solve and the state stay
float32: :mod:`swax.ops.precision`). Float64 inputs are computed in float64 (state float64
too), which lets tests check the chunk algebra to round-off and run
``torch.autograd.gradcheck``.
Backward is plain autograd through both modes (the chunk mode's graph holds ``C × C`` tiles per
chunk, never ``T × T``, and loops over chunks, never over time steps).

Files: this ``__init__`` holds the dispatch (:func:`gated_delta_rule`,
:func:`gated_delta_step`, their input checks) and registers the backends; ``recurrent.py`` the
step and the loop over time; ``chunk.py`` the chunkwise WY form (the ``native`` backend) and
:func:`plain_solve`; ``fla.py`` the adapter to flash-linear-attention.
"""

from __future__ import annotations

import math

import torch

from swax.ops.checks import (
    check_choice,
    check_floating,
    check_ndim,
    check_positive_int,
    check_shape,
)
from swax.ops.gated_delta.chunk import _chunk, plain_solve
from swax.ops.gated_delta.fla import _fla, _fla_environment, _fla_usable
from swax.ops.gated_delta.recurrent import _recurrent, _recurrent_step
from swax.ops.packing import by_document, check_doc_ids
from swax.ops.precision import autocast_off, products_dtype
from swax.ops.registry import list_backends, register_backend, select_backend

__all__ = ["gated_delta_rule", "gated_delta_step", "plain_solve"]

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
            "fla" or "native" (see the module docstring). A backend named that cannot run
            on these inputs is a BackendUnavailableError (a ValueError) with the reason;
            "auto" falls back. The recurrent mode is the reference and ignores it.
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
            return gated_delta_rule(
                q, k, v, g, beta, init, out_state, mode, chunk_size, scale, backend
            )

        # padding: decay exp(0) = 1 and write strength 0 leave the state as it is
        neutral = (0.0, 0.0, 0.0, 0.0, 0.0)
        return by_document(op, (q, k, v, g, beta), neutral, doc_ids, chunk_size, output_final_state)

    if mode == "chunk" and T > 0:
        impl = select_backend("gated_delta", backend, q, k, v, g, beta, initial_state)
        with autocast_off(q):  # the kernels choose their dtypes (swax.ops.precision)
            o, S = impl.fn(q, k, v, g, beta, initial_state, output_final_state, chunk_size, scale)
        return o, (S if output_final_state else None)
    if backend not in (None, "auto") and backend not in list_backends("gated_delta"):
        raise ValueError(
            f"{fn}: unknown backend {backend!r}; expected one of "
            f"{['auto', *list_backends('gated_delta')]}"
        )
    with autocast_off(q):
        o, S = _native(q, k, v, g, beta, initial_state, output_final_state, chunk_size, scale, mode)
    return o, (S if output_final_state else None)


def _native(q, k, v, g, beta, initial_state, output_final_state, chunk_size, scale, mode="chunk"):
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    out_dtype = q.dtype
    cd = _compute_dtype(q, k, v)
    # bfloat16 tiles in the chunk form's products (swax.ops.precision), else all in cd
    md = products_dtype(q) if mode == "chunk" and cd == torch.float32 else cd
    q = (q.to(cd) * scale).to(md)  # scaled in cd, rounded once to bfloat16 tiles
    k, v, g, beta = k.to(md), v.to(md), g.to(cd), beta.to(cd)
    if initial_state is None:
        S = torch.zeros(B, H, Dk, Dv, dtype=cd, device=q.device)
    else:
        S = initial_state.to(cd)

    if mode == "recurrent":
        o, S = _recurrent(q, k, v, g, beta, S)
    else:
        o, S = _chunk(q, k, v, g, beta, S, chunk_size)
    return o.to(out_dtype), S


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
