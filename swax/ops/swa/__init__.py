"""Causal sliding-window attention (and full causal attention as ``window=None``).

Convention (``docs/design.md``): the query at position t sees keys t - W + 1 … t — W keys,
itself included — which is flash-attn's ``window_size=(W - 1, 0)``. ``W >= T`` is full causal
attention.

Keys may be longer than queries (``Tk >= Tq``): queries are then aligned to the *end* of the keys
(query i sits at key position i + Tk - Tq), as in flash-attn. This is how chunked prefill and
decode attend to a cache of earlier keys.

Backends (chosen through :mod:`swax.ops.registry`, op name ``"swa"``), one file each; this
``__init__`` holds the dispatch (:func:`sliding_window_attention`) and registers them:

- ``blockwise`` (``blockwise.py``; any device; the CPU default when a gradient is needed):
  queries in blocks of ``bq``; each block attends to the ``bq + W - 1`` keys it can see.
  Time and memory O(T·(W + bq)), never a T×T tensor. Full causal attention (``W >= Tk``) goes
  to PyTorch's fused ``scaled_dot_product_attention`` (memory-efficient on CPU and GPU).
- ``blockwise_fwd`` (``forward.py``; CPU, no gradient needed: inference, prefill, evaluation;
  the CPU default there for windows below 512, and for any window where compiled flex is not
  taken): the same blocks, forward only, in small query blocks against ``unfold`` views of the
  keys, with the mask and the softmax in place; calls of up to 32k query rows over all heads
  lay the keys of all heads in one zero-padded stream.
- ``flash`` (``flash.py``; CUDA, fp16/bf16, ``flash_attn`` installed): ``flash_attn_func`` with
  ``window_size``.
- ``flex`` (``flex.py``): ``torch.nn.attention.flex_attention``, compiled, with a sliding-window
  block mask (built from the window's block structure, never a T×T mask). CUDA (``"auto"``
  takes it there), and the CPU for float32 inputs without gradient, where ``"auto"`` takes it
  for windows of 512 or more in calls of 256 queries or more (its fused kernel is faster there,
  benchmarks/README.md). Its first CPU call compiles (seconds), announced by a warning;
  ``SWAX_CPU_FLEX=0`` in the environment (:data:`CPU_FLEX_ENV`), a :func:`cpu_flex` ``(False)``
  block (``swax generate`` runs in one) or naming ``blockwise_fwd`` avoids it. If compiling
  fails it logs a warning and the call, and every later one, uses the next backend.
- ``reference`` (``reference.py``): naive masked softmax over the full Tq×Tk score matrix — a
  readable reference for small inputs only.

``common.py`` holds what several of them share (input checks, grouped-query key expansion,
fused-SDPA full causal attention, the band mask).
"""

from __future__ import annotations

import torch

from swax.ops.packing import check_doc_ids
from swax.ops.precision import autocast_off
from swax.ops.registry import register_backend, select_backend
from swax.ops.swa.blockwise import _blockwise
from swax.ops.swa.common import _check_inputs
from swax.ops.swa.flash import _flash, _flash_environment, _flash_usable
from swax.ops.swa.flex import (
    CPU_FLEX_ENV,
    CPU_FLEX_MIN_QUERIES,
    CPU_FLEX_MIN_WINDOW,
    _flex,
    _flex_prefer,
    _flex_usable,
    cpu_flex,
    cpu_flex_enabled,
)
from swax.ops.swa.forward import _blockwise_fwd, _fwd_usable
from swax.ops.swa.reference import _reference

__all__ = [
    "sliding_window_attention",
    "cpu_flex",
    "cpu_flex_enabled",
    "CPU_FLEX_ENV",
    "CPU_FLEX_MIN_WINDOW",
    "CPU_FLEX_MIN_QUERIES",
]


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int | None,
    scale: float | None = None,
    backend: str | None = None,
    doc_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention where each query sees the last ``window`` keys (itself included).

    Args:
        q: (B, Hq, Tq, D). k: (B, Hkv, Tk, D), v: (B, Hkv, Tk, Dv) with Hq a multiple of Hkv
            (grouped-query attention: query head h uses key/value head h // (Hq // Hkv)) and
            Tk >= Tq (queries aligned to the end of the keys).
        window: W >= 1, or None for full causal attention.
        scale: score scale, default D ** -0.5.
        backend: ``"auto"``/None, ``"blockwise"``, ``"flash"``, ``"flex"`` or ``"reference"``.
        doc_ids: (B, T) document index of each token (packed documents, see
            :mod:`swax.ops.packing`): a query sees only keys of its own document. Needs Tq == Tk
            (no cache); blockwise and reference do it ("auto" skips flash and flex, which
            are an error when named).

    Returns:
        (B, Hq, Tq, Dv) in q's dtype.
    """
    _check_inputs(q, k, v, window)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if doc_ids is not None:
        check_doc_ids(doc_ids, q.shape[0], q.shape[2], "sliding_window_attention")
        if k.shape[2] != q.shape[2]:
            raise ValueError(
                "sliding_window_attention: doc_ids need as many keys as queries (no cache), "
                f"got {k.shape[2]} keys for {q.shape[2]} queries"
            )
    impl = select_backend("swa", backend, q, k, v, window, doc_ids)
    with autocast_off(q):  # the backends choose their dtypes (swax.ops.precision)
        if doc_ids is None:  # a backend registered without document support takes 5 arguments
            return impl.fn(q, k, v, window, scale)
        return impl.fn(q, k, v, window, scale, doc_ids)


register_backend(
    "swa",
    "flash",
    _flash,
    _flash_usable,
    priority=30,
    doc="flash_attn_func with window_size=(W-1, 0); CUDA, fp16/bf16",
    environment=_flash_environment,
    packages=("flash-attn",),
)
register_backend(
    "swa",
    "flex",
    _flex,
    _flex_usable,
    priority=20,
    doc="compiled flex attention with a sliding-window block mask; CUDA, CPU without grad",
    prefer=_flex_prefer,
    packages=("torch",),
)
register_backend(
    "swa",
    "blockwise_fwd",
    _blockwise_fwd,
    _fwd_usable,
    priority=15,
    doc="forward-only query blocks against unfold-view key windows; CPU, no gradient",
)
register_backend(
    "swa",
    "blockwise",
    _blockwise,
    priority=10,
    doc="query blocks against strided key windows, O(T·W); any device",
)
register_backend(
    "swa",
    "reference",
    _reference,
    priority=0,
    doc="naive masked softmax over Tq×Tk; small inputs only",
)
