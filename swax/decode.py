"""A compiled decode step on fixed-shape buffers: the fast path of :func:`swax.generate.generate`.

A SWAX model's decode state never grows, so every decode step has the same shapes. After the
(chunked, eager) prefill, :class:`StaticState` copies the :class:`~swax.state.SwaxState` into
preallocated buffers, one set per layer:

- S layers: a ring buffer of W keys and values, the key of absolute position p in slot p % W;
- A layers (and S layers run with ``window=None``): a buffer of ``capacity`` slots, enough for
  the prompt and every new token (rounded up to a power of two, so that few sizes compile);
- X layers: the mLSTM memory (C, n, m [, conv]); D layers: the delta-rule memory (S, conv);

plus the position of each row, a (B,) tensor: rows may sit at different positions (batched
decode of prompts of different lengths, :func:`swax.generate.generate_batch`). One step
(:func:`decode_logits`: every layer's ``step`` method, then the head) writes the new key and
value into slot ``pos % R``, attends to the R slots under a validity mask and updates the
recurrent memories in place, so no shape depends on the position; the next token is picked
inside the same graph (argmax, or the temperature / top-k / top-p distribution whose one
multinomial draw follows outside, from the caller's seeded generator).

:func:`step_runner` compiles that step once per (batch size, buffer shapes and dtypes, device,
sampling options) and keeps it on the model for later calls: ``torch.compile`` (inductor) on the
CPU, a captured CUDA graph on a GPU; at most MAX_STEPS per model, least recently used evicted.
If compiling a configuration fails (no C compiler, an inductor error) it logs one warning and
returns None for that configuration: the caller then decodes with the eager reference path.
:meth:`StaticState.to_swax_state` gives the state back as a SwaxState (``return_state``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch
from torch import nn

from swax.layers.attention import AttentionState
from swax.state import SwaxState

log = logging.getLogger("swax")

ATTENTION_KINDS = ("S", "A")
MIN_CAPACITY = 256
"""Smallest slot count of a full-attention buffer (capacities are powers of two from here)."""


def capacity_for(tokens: int) -> int:
    """Slots of a full-attention buffer that holds ``tokens`` positions: the next power of two,
    at least :data:`MIN_CAPACITY`, so that generations of similar length share one graph."""
    cap = MIN_CAPACITY
    while cap < tokens:
        cap *= 2
    return cap


def _layer_window(window, i: int):
    return window[i] if isinstance(window, tuple) else window


def _check_part(model: nn.Module, state: SwaxState) -> None:
    """Raise ValueError unless ``state`` is a SwaxState of ``model`` that the static buffers can
    hold (a packed prefill's per-document attention states cannot)."""
    if not isinstance(state, SwaxState) or len(state.layers) != len(model.blocks):
        raise ValueError("state must be a SwaxState returned by this model")
    for layer in state.layers:
        if isinstance(layer, AttentionState) and layer.doc_start is not None:
            raise ValueError("a state after a packed prefill (doc_ids) has no static form")


@dataclasses.dataclass
class StaticState:
    """Fixed-shape decode buffers of a batch: ``layers[i]`` is layer i's tuple of tensors
    (see the module docstring), ``pos`` (B,) int64 the tokens each row has consumed (the
    position of its next token), ``window`` the SwaxState window they were built for."""

    layers: list[tuple[torch.Tensor, ...]]
    pos: torch.Tensor
    window: object

    @staticmethod
    def holds(model: nn.Module, state) -> bool:
        """Whether ``state`` (a SwaxState of ``model``) has a static form: not after a packed
        prefill (doc_ids), whose attention states mask per document."""
        try:
            _check_part(model, state)
        except ValueError:
            return False
        return True

    @classmethod
    def from_parts(
        cls,
        model: nn.Module,
        parts: Sequence[tuple[SwaxState, Sequence[int]]],
        capacity: int,
    ) -> StaticState:
        """Buffers for the rows of several states: ``parts`` holds (state, batch rows it fills),
        the rows of all parts covering 0 … B - 1 once; the states may sit at different
        positions (prompts of different lengths prefilled apart) but share one window.
        ``capacity``: slots of the full-attention buffers (above every position to come)."""
        rows = [r for _, rs in parts for r in rs]
        if not parts or sorted(rows) != list(range(len(rows))):
            raise ValueError("the parts' rows must cover 0 … B - 1 once each")
        first = parts[0][0]
        for state, _ in parts:
            _check_part(model, state)
            if state.window != first.window:
                raise ValueError("all parts of a static state need the same window")
            if state.pos > capacity and _has_full_attention(model, first.window):
                raise ValueError(f"position {state.pos} exceeds the capacity {capacity}")
        B = len(rows)
        layers = []
        for i, kind in enumerate(model.config.layer_types):
            bufs = None
            for state, rs in parts:
                index = torch.as_tensor(list(rs), dtype=torch.long)
                tensors = _layer_tensors(kind, state.layers[i], capacity)
                if bufs is None:
                    bufs = tuple(t.new_zeros((B, *t.shape[1:])) for t in tensors)
                for buf, t in zip(bufs, tensors):
                    buf.index_copy_(0, index.to(buf.device), t.to(buf.dtype))
            layers.append(bufs)
        device = model.embed.weight.device
        pos = torch.zeros(B, dtype=torch.long, device=device)
        for state, rs in parts:
            pos[torch.as_tensor(list(rs), device=device)] = state.pos
        return cls(layers, pos, first.window)

    def to_swax_state(self, model: nn.Module) -> SwaxState:
        """The state as a SwaxState (copies), for rows that share one position."""
        p = int(self.pos[0])
        if bool((self.pos != p).any()):
            raise ValueError("rows at different positions have no common SwaxState")
        out = []
        for i, (kind, bufs) in enumerate(zip(model.config.layer_types, self.layers)):
            if kind not in ATTENTION_KINDS:
                out.append(tuple(b.clone() for b in bufs))
                continue
            w = _layer_window(self.window, i) if kind == "S" else None
            k, v = bufs if w is not None else (b[:, :, :p] for b in bufs)
            out.append(AttentionState(k.clone(), v.clone(), p, w))
        return SwaxState(tuple(out), p, self.window)

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer, the positions last."""
        return [t for bufs in self.layers for t in bufs] + [self.pos]


def _has_full_attention(model: nn.Module, window) -> bool:
    kinds = model.config.layer_types
    return any(
        k == "A" or (k == "S" and _layer_window(window, i) is None) for i, k in enumerate(kinds)
    )


def _layer_tensors(kind: str, layer_state, capacity: int) -> tuple[torch.Tensor, ...]:
    """One layer's state as the tensors of its buffers (batch first)."""
    if kind not in ATTENTION_KINDS:
        return tuple(layer_state)
    st: AttentionState = layer_state
    if st.window is not None:  # already a ring of W slots
        return st.k, st.v
    B, H, _, D = st.k.shape
    k = st.k.new_zeros(B, H, capacity, D)
    v = st.v.new_zeros(B, H, capacity, st.v.shape[-1])
    k[:, :, : st.pos] = st.k
    v[:, :, : st.pos] = st.v
    return k, v


# ------------------------------------------------------------------------------ the step


def sampling_probs(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """The distribution (B, vocab) float32 that sampling draws from: softmax(logits /
    temperature) restricted to the top-k and to the nucleus of mass top_p (temperature > 0)."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass of the tokens before it already reaches top_p
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits.softmax(-1)


def decode_logits(model: nn.Module, layers, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Feed ``tok`` (B,) at positions ``pos`` (B,) through ``model`` on the buffers ``layers``
    (updated in place, ``pos`` incremented); return the next logits (B, vocab) in float32."""
    x = model.embed(tok)
    for block, state in zip(model.blocks, layers):
        x = x + block.mixer.step(block.mixer_norm(x), state, pos)
        x = x + block.mlp(block.mlp_norm(x))
    logits = model.logits(model.norm(x)).float()
    pos.add_(1)
    return logits


def _step(model, layers, tok, pos, sampling):
    """One step: the next token (B,) for greedy decoding (``sampling`` None), else the
    distribution to draw it from (B, vocab)."""
    logits = decode_logits(model, layers, tok, pos)
    if sampling is None:
        return logits.argmax(-1)
    return sampling_probs(logits, *sampling)


# ------------------------------------------------------------------------------ compiled steps

_FAILED: dict[tuple, str] = {}
"""(device type, configuration) -> why compiling it failed: that configuration decodes eagerly
from then on; the others still compile."""

MAX_STEPS = 8
"""Compiled steps kept per model (each holds its graph and, on CUDA, buffers of its own); the
least recently used goes first."""


def _own_code(fn: Callable, n: int) -> Callable:
    """A copy of ``fn`` with a code object of its own: torch._dynamo keeps compiled graphs and
    counts its recompile limit per code object, so each configuration gets its own cache
    instead of evicting the others'."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{n}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


BACKEND = "inductor"
"""torch.compile's backend for the step unless ``$SWAX_COMPILE_BACKEND`` names another (the fast
tests trace with "aot_eager": dynamo and AOT autograd without inductor's C++ compile, seconds
instead of tens of seconds)."""

BACKEND_ENV = "SWAX_COMPILE_BACKEND"


def compile_backend() -> str:
    """The backend the next compiled step uses: ``$SWAX_COMPILE_BACKEND``, else :data:`BACKEND`."""
    return os.environ.get(BACKEND_ENV) or BACKEND


INDUCTOR_OPTIONS = {"cpp_wrapper": True}
"""Inductor's wrapper in C++: the ~40 kernel and matmul calls of a step without a Python call
each (about 1.5x faster per token on the CPU, benchmarks/README.md)."""


class StepRunner:
    """One compiled decode step of one configuration. ``run(static, tok)`` advances ``static``
    (a StaticState of that configuration) by ``tok`` (B,) and returns what :func:`_step`
    returns. ``compile_s``: seconds the compile took (the first call's cost). The step has a
    code object of its own (:func:`_own_code`): its compiled graph is the only entry of its
    dynamo cache, so guard evaluation stays short and no other configuration evicts it."""

    def __init__(self, model: nn.Module, sampling, n: int):
        self.model, self.sampling = model, sampling
        backend = compile_backend()
        options = INDUCTOR_OPTIONS if backend == "inductor" else None
        self.fn = torch.compile(
            _own_code(_step, n), fullgraph=True, dynamic=False, backend=backend, options=options
        )
        self.compile_s = 0.0

    def warm_up(self, static: StaticState, tok: torch.Tensor) -> None:
        """Compile on copies of the buffers (a failing compile touches no real state)."""
        copies = [tuple(t.clone() for t in bufs) for bufs in static.layers]
        t0 = time.perf_counter()
        self.fn(self.model, copies, tok.clone(), static.pos.clone(), self.sampling)
        self.compile_s = time.perf_counter() - t0

    def run(self, static: StaticState, tok: torch.Tensor) -> torch.Tensor:
        return self.fn(self.model, static.layers, tok, static.pos, self.sampling)


class CudaGraphRunner(StepRunner):
    """The step captured in a CUDA graph on buffers of its own: ``run`` copies the state in
    when it is a new one, replays the graph, and leaves the state in the graph's buffers
    (``static`` is rebound to them)."""

    def __init__(self, model: nn.Module, sampling, n: int):
        self.model, self.sampling, self.compile_s = model, sampling, 0.0
        self.graph, self.static, self.out = None, None, None

    def warm_up(self, static: StaticState, tok: torch.Tensor) -> None:
        t0 = time.perf_counter()
        mine = StaticState(
            [tuple(t.clone() for t in b) for b in static.layers], static.pos.clone(), static.window
        )
        self.tok = tok.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # allocations and lazy set-up before the capture
            scratch = [tuple(t.clone() for t in b) for b in mine.layers]
            _step(self.model, scratch, self.tok, mine.pos.clone(), self.sampling)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = _step(self.model, mine.layers, self.tok, mine.pos, self.sampling)
        self.static = mine
        torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - t0

    def run(self, static: StaticState, tok: torch.Tensor) -> torch.Tensor:
        if static is not self.static:  # a new generation: its state into the graph's buffers
            for dst, src in zip(self.static.tensors(), static.tensors()):
                dst.copy_(src)
            static.layers, static.pos = self.static.layers, self.static.pos
            self.static = static
        self.tok.copy_(tok)
        self.graph.replay()
        return self.out.clone()


def _config_key(static: StaticState, sampling) -> tuple:
    return (
        tuple((tuple(t.shape), t.dtype) for t in static.tensors()),
        static.pos.device.type,
        static.pos.device.index,
        static.window,
        sampling,
    )


def _weights_key(model: nn.Module, device: str) -> tuple:
    """What a step depends on in the weights: their shapes, dtypes and devices, and on CUDA,
    where a captured graph reads fixed addresses, their storage too, so that a model moved,
    cast or given new tensors (``cpu().cuda()``, ``half().float()``, ``load_state_dict(...,
    assign=True)``) never replays a graph on memory it no longer owns. (An in-place load keeps
    the storage: the graph reads the new values.)"""
    if device == "cuda":
        return tuple(
            (p.shape, p.dtype, p.device, p.untyped_storage().data_ptr()) for p in model.parameters()
        )
    return tuple((p.shape, p.dtype, p.device) for p in model.parameters())


def _is_oom(e: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(e, oom) or "out of memory" in str(e).lower()


def step_runner(
    model: nn.Module, static: StaticState, tok: torch.Tensor, sampling, compile_new: bool = True
) -> StepRunner | None:
    """The compiled step for this configuration: kept on ``model`` from an earlier call (at most
    :data:`MAX_STEPS`, least recently used evicted), else compiled now when ``compile_new``
    (``tok``: a token batch of the right shape); None when there is none, or compiling this
    configuration failed (one warning says why; other configurations still compile; running out
    of memory is reported as such and tried again next time), so the caller decodes eagerly.
    ``sampling``: None (greedy) or (temperature, top_k, top_p)."""
    device = static.pos.device.type
    config = _config_key(static, sampling)
    if (device, config) in _FAILED:
        return None
    cache = model.__dict__.setdefault("_swax_decode_steps", OrderedDict())
    key = (config, _weights_key(model, device))
    runner = cache.get(key)
    if runner is not None:
        cache.move_to_end(key)
        return runner
    if not compile_new:
        return None
    made = model.__dict__.get("_swax_decode_made", 0)
    model.__dict__["_swax_decode_made"] = made + 1  # each step its own code object
    cls = CudaGraphRunner if device == "cuda" else StepRunner
    runner = cls(model, sampling, made)
    try:
        runner.warm_up(static, tok)
    except Exception as e:  # noqa: BLE001 - any compile failure: decode eagerly, never crash
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        if _is_oom(e):
            log.warning(
                "swax: out of memory compiling the decode step for batch %d on %s (%s); "
                "decoding eagerly this time",
                tok.shape[0],
                device,
                why,
            )
            return None
        _FAILED[(device, config)] = why
        log.warning(
            "swax: compiling the decode step failed on %s for batch %d (%s); decoding this "
            "configuration eagerly (compile=False / --no-compile skips the attempt)",
            device,
            tok.shape[0],
            why,
        )
        return None
    log.info(
        "swax: compiled the decode step for batch %d in %.1f s", tok.shape[0], runner.compile_s
    )
    cache[key] = runner
    spent = model.__dict__.get("_swax_decode_compile_s", 0.0)
    model.__dict__["_swax_decode_compile_s"] = spent + runner.compile_s
    while len(cache) > MAX_STEPS:
        cache.popitem(last=False)
    return runner


def compile_seconds(model: nn.Module) -> float:
    """Seconds spent so far compiling decode steps for ``model`` in this process (the first
    call of each configuration), e.g. to keep them out of a tokens-per-second figure."""
    return model.__dict__.get("_swax_decode_compile_s", 0.0)
