"""``flex``: ``torch.nn.attention.flex_attention``, compiled, with a sliding-window block mask
(built from the window's block structure, never a T×T mask).

CUDA (``"auto"`` takes it there), and the CPU for float32 inputs without gradient (its CPU
backward does not exist), inductor's CPU template present, outside ``torch.compile`` and within
the recompile budget. On the CPU ``"auto"`` takes it for windows of 512 or more in calls of 256
queries or more: there its fused kernel is faster than ``blockwise_fwd`` (and than fused SDPA
where the window covers the keys) on one and on two threads, and elsewhere it is slower
(benchmarks/README.md). Its first CPU call compiles (seconds; a second length compiles once
more, after which lengths are symbolic and nothing recompiles), announced by a warning;
``SWAX_CPU_FLEX=0`` in the environment (:data:`CPU_FLEX_ENV`), a :func:`cpu_flex` ``(False)``
block (``swax generate`` runs in one) or naming ``blockwise_fwd`` avoids it. If compiling fails
it logs a warning and the call, and every later one, uses the next backend.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache

import torch
import torch.nn.functional as F

from swax.ops.registry import log, select_backend, warn_once
from swax.ops.swa.common import _causal_sdpa, _needs_grad, _round_up


def _flex_usable(q, k, v, window, doc_ids=None):
    if doc_ids is not None:
        return "document masking (doc_ids) is not implemented for it"
    if q.device.type not in ("cuda", "cpu"):
        return "needs CUDA or the CPU"
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return "torch.nn.attention.flex_attention is not available"
    return _flex_cpu_usable(q, k, v, window) if q.device.type == "cpu" else None


_FLEX_CPU_STATE: dict = {"failed": None, "shapes": set(), "announced": False}


@lru_cache(maxsize=1)
def _flex_cpu_template() -> str | None:
    import importlib.util

    name = "torch._inductor.codegen.cpp_flex_attention_template"
    try:  # found, not imported: importing inductor's codegen first would be circular
        found = importlib.util.find_spec(name) is not None
    except ImportError:
        found = False
    return None if found else f"inductor's CPU flex template ({name}) is missing"


def _flex_cpu_budget() -> int:
    """Kernels compiled before torch._dynamo's recompile limit would send flex to eager mode
    (which builds T×T scores)."""
    cfg = torch._dynamo.config
    return max(1, getattr(cfg, "recompile_limit", getattr(cfg, "cache_size_limit", 8)) - 1)


def _flex_cpu_compiled() -> int:
    """Kernels compiled so far for swax's CPU flex frame; where torch does not say, the number
    of shapes run (an upper bound: lengths after the second are symbolic)."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(_flex_call_cpu.__code__))
    except Exception:  # noqa: BLE001 - a private torch helper: count shapes instead
        return len(_FLEX_CPU_STATE["shapes"])


def _flex_cpu_usable(q, k, v, window):
    if _needs_grad(q, k, v):
        return "on the CPU its backward is not implemented (forward only, no gradient)"
    if q.dtype != torch.float32:
        return f"on the CPU, float32 inputs only, got {q.dtype}"
    if torch.compiler.is_compiling():
        return "on the CPU, not inside torch.compile"
    if _FLEX_CPU_STATE["failed"]:
        return _FLEX_CPU_STATE["failed"]
    reason = _flex_cpu_template()
    if reason:
        return reason
    if _flex_shape_key(q, k, v, window) not in _FLEX_CPU_STATE["shapes"]:
        compiled = _flex_cpu_compiled()
        if compiled >= _flex_cpu_budget():
            return f"{compiled} kernels compiled already (torch._dynamo's recompile limit)"
    return None


CPU_FLEX_MIN_WINDOW = 512
"""From this window on, ``"auto"`` takes compiled flex on the CPU (forward, no gradient): its
fused kernel is faster there than ``blockwise_fwd`` (and than fused SDPA where the window covers
the keys), on one thread and on two; below it ``blockwise_fwd`` is faster in long calls (W=128:
1.04-1.29x flex from T=1024, benchmarks/README.md). Flex is faster in some short ones below 512
too (W=256 at T=1024: 0.83x / 0.71x on one / two threads; batches of 16 256-token sequences
at W=128: 0.68x / 0.60x); they stay on ``blockwise_fwd`` until a rule for them is measured."""

CPU_FLEX_MIN_QUERIES = 256
"""... in calls of at least this many queries: with fewer (a 128-query block padded to flex's
block size, a decode step) ``blockwise_fwd`` is faster or as fast."""


CPU_FLEX_ENV = "SWAX_CPU_FLEX"
"""Set to 0 (or false / off / no) and ``"auto"`` never takes compiled flex on the CPU: no
compile pause, at the speed of ``blockwise_fwd``; set to 1 (true / on / yes) and it does where
it is faster, also inside :func:`cpu_flex` ``(False)`` (as in ``swax generate``). Unset (or
any other value), :func:`cpu_flex` decides, and outside it ``"auto"`` may take compiled flex.
Asking for flex by name works either way."""

_CPU_FLEX: ContextVar[bool] = ContextVar("swax_cpu_flex", default=True)
"""Whether ``"auto"`` may compile flex on the CPU where :data:`CPU_FLEX_ENV` does not say: set
only by :func:`cpu_flex`, for the block it wraps."""


@contextmanager
def cpu_flex(enabled: bool) -> Iterator[None]:
    """Within the block, whether ``"auto"`` may compile flex attention on the CPU (for the
    long windows and calls where it is the faster path, see :func:`_flex_prefer`).

    :data:`CPU_FLEX_ENV`, when set to an on or off value, wins over the block: the variable is
    the user's word, the block the program's default. Outside every block ``"auto"`` may
    compile it. A one-shot job that runs little attention (``swax generate``: one prompt) runs
    in ``cpu_flex(False)``: the compile (3–9 s, once per process) costs more than it saves
    there. Blocks nest, and the previous setting comes back on exit (an exception included).
    The setting is a :class:`contextvars.ContextVar`: it holds for the calling thread (or
    asyncio task) only; a thread started inside the block begins with the default. A backend
    named explicitly (``backend="flex"``, ``backend="blockwise_fwd"``) ignores it.
    """
    token = _CPU_FLEX.set(bool(enabled))
    try:
        yield
    finally:
        _CPU_FLEX.reset(token)


def cpu_flex_enabled() -> bool:
    """Whether ``"auto"`` may take compiled flex on the CPU here: :data:`CPU_FLEX_ENV` when it
    says on or off, else the innermost :func:`cpu_flex` block, else True."""
    env = os.environ.get(CPU_FLEX_ENV, "").strip().lower()
    if env in ("0", "false", "off", "no"):
        return False
    return env in ("1", "true", "on", "yes") or _CPU_FLEX.get()


def _flex_prefer(q, k, v, window, doc_ids=None):
    """Where ``"auto"`` takes flex: on CUDA, and on the CPU for long windows in calls of 256
    queries or more (unless turned off, see :data:`CPU_FLEX_ENV`)."""
    if q.device.type != "cpu":
        return None
    if window is None:
        return "the CPU, full causal attention: fused SDPA"
    if window < CPU_FLEX_MIN_WINDOW:
        return f"the CPU, windows below {CPU_FLEX_MIN_WINDOW}: blockwise_fwd is faster"
    if q.shape[2] < CPU_FLEX_MIN_QUERIES:
        return f"the CPU, fewer than {CPU_FLEX_MIN_QUERIES} queries: blockwise_fwd is faster"
    if not cpu_flex_enabled():
        return f"the CPU: turned off ({CPU_FLEX_ENV} or cpu_flex)"
    return None


def _flex_shape_key(q, k, v, window):
    Tq, Tk = q.shape[2], k.shape[2]
    _, tq_p, tk_p = _flex_shapes(Tq, Tk, min(window or Tk, Tk))
    return (q.shape[0], q.shape[1], k.shape[1], tq_p, tk_p, q.shape[3], v.shape[3], q.dtype)


def _flex_call(q, k, v, block_mask, scale, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _flex_call_cpu(q, k, v, block_mask, scale, enable_gqa):
    """The same call in a frame of its own: the CPU's compiled kernels (dynamic lengths) are
    counted apart from CUDA's."""
    return _flex_call(q, k, v, block_mask, scale, enable_gqa)


@lru_cache(maxsize=2)
def _compiled_flex(cpu: bool = False):
    """swax's own compiled frames: torch._dynamo's recompile limit counts compilations per
    frame, so a caller's own ``torch.compile(flex_attention)`` shapes do not use up swax's. On
    the CPU lengths are dynamic: the first length compiles, the second compiles once more with
    symbolic lengths, and later lengths reuse that kernel (CUDA keeps static shapes)."""
    if cpu:
        return torch.compile(_flex_call_cpu, dynamic=True)
    return torch.compile(_flex_call, dynamic=False)


_FLEX_BLOCK = 128  # flex attention's default block size; lengths are rounded up to it


def _flex_shapes(tq: int, tk: int, window: int) -> tuple[int, int, int]:
    """(keys kept, padded queries, padded keys) for flex attention.

    Keys older than ``tq + window - 1`` are seen by no query and are dropped. Queries are padded
    to a multiple of the block size; keys to the same length when no cached key is left
    (``keep == tq``), else to the padded length of ``padded queries + window - 1``. So a
    (query length, window) pair compiles at most two kernels, whatever the cache length: chunked
    prefill does not recompile for every key length (it did, until torch._dynamo's recompile
    limit sent it to the slow eager path)."""
    keep = min(tk, tq + window - 1)
    tq_p = _round_up(tq, _FLEX_BLOCK)
    tk_p = tq_p if keep == tq else _round_up(tq_p + window - 1, _FLEX_BLOCK)
    return keep, tq_p, tk_p


def _band_blocks(nq: int, nk: int, off: int, window: int, device) -> tuple:
    """(partial, full) (nq, nk) bools: which (query block, key block) pairs of the band
    (key <= query + off < key + window) some / all of their pairs see. From the blocks' corners,
    O(nq·nk): no T×T mask is ever made."""
    blk = _FLEX_BLOCK
    first = torch.arange(nq, device=device)[:, None] * blk + off  # key position of 1st query
    last = first + blk - 1
    k0 = torch.arange(nk, device=device)[None, :] * blk
    k1 = k0 + blk - 1
    some = (k0 <= last) & (k1 > first - window)
    full = (k1 <= first) & (k0 > last - window)
    return some & ~full, full


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(count, indices) per query block, the marked key blocks first, as BlockMask wants."""
    num = blocks.sum(-1).to(torch.int32)[None, None]
    idx = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, idx[None, None]


@lru_cache(maxsize=32)
def _flex_block_mask(tq: int, tk: int, window: int, device: str):
    """Block mask for ``tq`` queries aligned to the end of ``tk`` keys (both then padded at
    the end, see :func:`_flex_shapes`). The offset and the window enter the mask as tensors,
    not Python ints, so masks of other lengths or windows reuse the compiled kernel."""
    from torch.nn.attention.flex_attention import BlockMask

    _, tq_p, tk_p = _flex_shapes(tq, tk, window)
    off = torch.tensor(tk - tq, device=device)
    w = torch.tensor(window, device=device)

    def mask_mod(b, h, qi, ki):
        return (qi + off >= ki) & (qi + off - ki < w)

    partial, full = _band_blocks(tq_p // _FLEX_BLOCK, tk_p // _FLEX_BLOCK, tk - tq, window, device)
    return BlockMask.from_kv_blocks(
        *_ordered(partial), *_ordered(full), _FLEX_BLOCK, mask_mod, seq_lengths=(tq_p, tk_p)
    )


def _flex(q, k, v, window, scale, doc_ids=None):
    # nothing to mask beyond causality, or a single query: the fused SDPA kernels do it without
    # compiling a block mask per (Tq, Tk) (decode would otherwise recompile every token); on the
    # CPU a window covering all keys is a causal band, faster in flex than in SDPA
    Tq, Tk = q.shape[2], k.shape[2]
    cpu = q.device.type == "cpu"
    if window is None or (window >= Tk and not cpu):
        return _causal_sdpa(q, k, v, scale)
    if Tq == 1:
        return _causal_sdpa(q, k[:, :, -window:], v[:, :, -window:], scale)
    if cpu:  # one memory layout (a layer's transposed views, a cache's contiguous keys, padded
        # queries), or dynamo compiles again for each layout on top of the two for the lengths
        qp, kp, vp, mask = _flex_padded(q, k, v, window)
        qp, kp, vp = (x.contiguous() for x in (qp, kp, vp))
        return _flex_cpu_call(q, k, v, window, scale, (qp, kp, vp, mask))
    return _flex_banded(q, k, v, window, scale, _compiled_flex())


def _flex_padded(q, k, v, window):
    """(queries, keys, values, block mask) for flex: the keys no query sees dropped, queries
    and keys padded at the end to whole blocks (see :func:`_flex_shapes`)."""
    Tq, Tk = q.shape[2], k.shape[2]
    window = min(window, Tk)
    keep, tq_p, tk_p = _flex_shapes(Tq, Tk, window)
    kk, vv = k[:, :, Tk - keep :], v[:, :, Tk - keep :]
    mask = _flex_block_mask(Tq, keep, window, str(q.device))
    qp = F.pad(q, (0, 0, 0, tq_p - Tq)) if tq_p > Tq else q
    kp, vp = (F.pad(x, (0, 0, 0, tk_p - keep)) if tk_p > keep else x for x in (kk, vv))
    return qp, kp, vp, mask


def _flex_banded(q, k, v, window, scale, call):
    """flex's CUDA branch around ``call`` (compiled flex_attention there; the tests pass the
    eager one on the CPU, with gradients): padding, block mask, GQA, the output's slice."""
    qp, kp, vp, mask = _flex_padded(q, k, v, window)
    out = call(qp, kp, vp, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[:, :, : q.shape[2]]


def _flex_cpu_call(q, k, v, window, scale, padded):
    """The compiled flex call on the CPU; if it fails (no compiler, an inductor error), logs a
    warning and runs this and every later call on the next backend."""
    qp, kp, vp, mask = padded
    state = _FLEX_CPU_STATE
    if not state["announced"]:
        state["announced"] = True
        # a warning, so that it is seen: the compile is a pause of seconds with no other output
        log.warning(
            "swax: swa on the CPU: compiling flex attention (no gradient, window %d); "
            "this takes seconds, once or twice per process (%s=0 avoids it)",
            window,
            CPU_FLEX_ENV,
        )
    try:
        out = _compiled_flex(cpu=True)(
            qp, kp, vp, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
    except Exception as e:  # noqa: BLE001 - any compile failure: fall back, never crash
        state["failed"] = f"compiling it failed on this CPU ({type(e).__name__}: {str(e)[:120]})"
        chosen = select_backend("swa", "auto", q, k, v, window)
        warn_once("swa", "flex", state["failed"], chosen.name)
        return chosen.fn(q, k, v, window, scale)
    state["shapes"].add(_flex_shape_key(q, k, v, window))
    return out[:, :, : q.shape[2]]
