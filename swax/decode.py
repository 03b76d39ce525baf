"""The fixed-shape decode of :func:`swax.generate.generate`: one step, compiled or not.

A SWAX model's decode state never grows, so every decode step has the same shapes. After the
(chunked, eager) prefill, :class:`StaticState` asks each layer's mixer for its state as
fixed-shape buffers (``decode_buffers``, the protocol of :mod:`swax.layers.base`): a ring of
W keys and values for a sliding-window layer, a buffer of ``capacity`` slots for full attention
(rounded up to a power of two, so that few sizes compile), the recurrent memories of the mLSTM
and Gated DeltaNet layers; plus the position of each row, a (B,) tensor: rows may sit at
different positions (batched decode of prompts of different lengths,
:func:`swax.generate.generate_batch`). This module never looks at the layer kinds: a new mixer
that implements the protocol decodes here unchanged.

One step (:func:`decode_logits`: every block's ``step``, then the head) updates the buffers in
place, so no shape depends on the position; the next token is picked by :mod:`swax.sampling`,
the one module that picks: inside the same function :func:`~swax.sampling.pick_in_step` (argmax,
or the temperature / top-k / top-p distribution, whose temperature and top-p are tensors: one
graph serves every value), then outside it :func:`~swax.sampling.pick_after_step` (the
distribution's one draw, from the caller's seeded generator). The eager reference
(``compile=False``) runs that same function uncompiled.

:func:`step_runner` compiles it once per (batch size, buffer shapes and dtypes, device, sampling
mode) and keeps it on the model for later calls: ``torch.compile`` (inductor) on the CPU; on a
GPU the inductor-compiled step captured in a CUDA graph; at most MAX_STEPS per model, least
recently used evicted. If compiling a configuration fails (no C compiler, an inductor error) it
logs one warning and returns None for that configuration: the caller then runs the eager step.
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

from swax.layers.base import NoStaticForm
from swax.sampling import Sampling, pick_after_step, pick_in_step
from swax.state import SwaxState, map_tensors

log = logging.getLogger("swax")

MIN_CAPACITY = 256
"""Smallest slot count of a buffer that grows with the context (capacities are powers of two
from here)."""


def capacity_for(tokens: int) -> int:
    """Slots of a full-attention buffer that holds ``tokens`` positions: the next power of two,
    at least :data:`MIN_CAPACITY`, so that generations of similar length share one graph."""
    cap = MIN_CAPACITY
    while cap < tokens:
        cap *= 2
    return cap


def _layer_window(window, i: int):
    return window[i] if isinstance(window, tuple) else window


@dataclasses.dataclass
class StaticState:
    """Fixed-shape decode buffers of a batch: ``layers[i]`` is layer i's tuple of tensors
    (its mixer's ``decode_buffers``), ``pos`` (B,) int64 the tokens each row has consumed (the
    position of its next token), ``window`` the SwaxState window they were built for."""

    layers: list[tuple[torch.Tensor, ...]]
    pos: torch.Tensor
    window: object

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
        ``capacity``: slots of the buffers that grow with the context (above every position to
        come). Raises :class:`~swax.layers.base.NoStaticForm` (a ValueError) when a layer's
        state has no fixed-shape form or the parts' buffers do not stack."""
        rows = [r for _, rs in parts for r in rs]
        if not parts or sorted(rows) != list(range(len(rows))):
            raise ValueError("the parts' rows must cover 0 … B - 1 once each")
        first = parts[0][0]
        for state, _ in parts:
            if not isinstance(state, SwaxState) or len(state.layers) != len(model.blocks):
                raise ValueError("state must be a SwaxState returned by this model")
            if state.window != first.window:
                raise ValueError("all parts of a static state need the same window")
        B = len(rows)
        layers = []
        for i, block in enumerate(model.blocks):
            per_part = [block.mixer.decode_buffers(st.layers[i], capacity) for st, _ in parts]
            if len(parts) == 1 and list(parts[0][1]) == list(range(B)):
                layers.append(tuple(per_part[0]))  # fresh tensors already, rows in order
                continue
            shapes = {tuple((t.shape[1:], t.dtype) for t in bufs) for bufs in per_part}
            if len(shapes) > 1:
                raise NoStaticForm(f"layer {i}: the parts' decode buffers differ in shape")
            bufs = tuple(t.new_zeros((B, *t.shape[1:])) for t in per_part[0])
            for (_, rs), tensors in zip(parts, per_part):
                index = torch.as_tensor(list(rs), dtype=torch.long)
                for buf, t in zip(bufs, tensors):
                    buf.index_copy_(0, index.to(buf.device), t)
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
        out = tuple(
            map_tensors(
                block.mixer.decode_state(bufs, p, _layer_window(self.window, i)), torch.clone
            )
            for i, (block, bufs) in enumerate(zip(model.blocks, self.layers))
        )
        return SwaxState(out, p, self.window)

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer, the positions last."""
        return [t for bufs in self.layers for t in bufs] + [self.pos]


# ------------------------------------------------------------------------------ the step


def decode_logits(model: nn.Module, layers, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Feed ``tok`` (B,) at positions ``pos`` (B,) through ``model`` on the buffers ``layers``
    (updated in place, ``pos`` incremented); return the next logits (B, vocab) in float32."""
    x = model.embed(tok)
    for block, buffers in zip(model.blocks, layers):
        x = block.step(x, buffers, pos)
    logits = model.logits(model.norm(x)).float()
    pos.add_(1)
    return logits


def _step(model, layers, tok, pos, mode, values):
    """One step: the next token (B,) for greedy decoding (``mode`` None), else the
    distribution to draw it from (B, vocab)."""
    return pick_in_step(decode_logits(model, layers, tok, pos), mode, values)


class EagerStep:
    """The step uncompiled: the reference every compiled step is held to, and what runs when
    nothing is compiled. ``run(static, tok, values)`` advances ``static`` by ``tok`` (B,)."""

    compile_s = 0.0

    def __init__(self, model: nn.Module, mode):
        self.model, self.mode = model, mode

    def run(self, static: StaticState, tok: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return _step(self.model, static.layers, tok, static.pos, self.mode, values)


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
    """One compiled decode step of one configuration. ``run(static, tok, values)`` advances
    ``static`` (a StaticState of that configuration) by ``tok`` (B,) and returns what
    :func:`_step` returns. ``compile_s``: seconds the compile took (the first call's cost).
    The step has a code object of its own (:func:`_own_code`): its compiled graph is the only
    entry of its dynamo cache, so guard evaluation stays short and no other configuration
    evicts it."""

    def __init__(self, model: nn.Module, mode, n: int):
        self.model, self.mode = model, mode
        self.fn = _compiled(n, cpu=True)
        self.compile_s = 0.0

    def warm_up(self, static: StaticState, tok: torch.Tensor, values: torch.Tensor) -> None:
        """Compile on copies of the buffers (a failing compile touches no real state)."""
        copies = [tuple(t.clone() for t in bufs) for bufs in static.layers]
        t0 = time.perf_counter()
        self.fn(self.model, copies, tok.clone(), static.pos.clone(), self.mode, values)
        self.compile_s = time.perf_counter() - t0

    def run(self, static: StaticState, tok: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return self.fn(self.model, static.layers, tok, static.pos, self.mode, values)


def _compiled(n: int, cpu: bool):
    """:func:`_step` under torch.compile with its own code object (C++ wrapper on the CPU)."""
    backend = compile_backend()
    options = INDUCTOR_OPTIONS if backend == "inductor" and cpu else None
    return torch.compile(
        _own_code(_step, n), fullgraph=True, dynamic=False, backend=backend, options=options
    )


class CudaGraphRunner(StepRunner):
    """The step compiled by inductor, then captured in a CUDA graph on buffers of its own (as
    gpt-fast's "reduce-overhead", with the graph and its buffers owned here): ``run`` copies the
    state in when it is a new one, copies the token and the sampling values into the graph's
    inputs, replays the graph, and leaves the state in the graph's buffers (``static`` is
    rebound to them). If inductor cannot compile the step, the eager step is captured instead
    (one warning). The runner is keyed on the weights' storage (:func:`_weights_key`), so it
    never replays on memory the model no longer owns."""

    def __init__(self, model: nn.Module, mode, n: int):
        self.model, self.mode, self.n, self.compile_s = model, mode, n, 0.0
        self.graph, self.static, self.out = None, None, None

    def warm_up(self, static: StaticState, tok: torch.Tensor, values: torch.Tensor) -> None:
        t0 = time.perf_counter()
        mine = StaticState(
            [tuple(t.clone() for t in b) for b in static.layers], static.pos.clone(), static.window
        )
        self.tok, self.values = tok.clone(), values.clone()
        fn = _compiled(self.n, cpu=False)
        try:
            self._run_aside(fn, mine)
        except Exception as e:  # noqa: BLE001 - capture the eager step instead
            if _is_oom(e):
                raise
            log.warning(
                "swax: inductor could not compile the CUDA decode step (%s: %s); capturing the "
                "eager step",
                type(e).__name__,
                str(e).splitlines()[0][:160] if str(e) else "",
            )
            fn = _step
            self._run_aside(fn, mine)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(self.model, mine.layers, self.tok, mine.pos, self.mode, self.values)
        self.static = mine
        torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - t0

    def _run_aside(self, fn, mine: StaticState) -> None:
        """Run ``fn`` on scratch copies on a side stream: compilation, autotuning, lazy
        allocations and workspace set-up happen before the capture."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                scratch = [tuple(t.clone() for t in b) for b in mine.layers]
                fn(self.model, scratch, self.tok, mine.pos.clone(), self.mode, self.values)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def run(self, static: StaticState, tok: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if static is not self.static:  # a new generation: its state into the graph's buffers
            for dst, src in zip(self.static.tensors(), static.tensors()):
                dst.copy_(src)
            static.layers, static.pos = self.static.layers, self.static.pos
            self.static = static
        self.tok.copy_(tok)
        self.values.copy_(values)
        self.graph.replay()
        return self.out.clone()


def _config_key(static: StaticState, mode) -> tuple:
    return (
        tuple((tuple(t.shape), t.dtype) for t in static.tensors()),
        static.pos.device.type,
        static.pos.device.index,
        static.window,
        mode,
    )


def _weights_key(model: nn.Module, device: str) -> tuple:
    """What a step depends on in the weights (parameters and buffers, e.g. the int8 weights and
    scales of :func:`swax.quant.decode_weights`): their shapes, dtypes and devices, and on CUDA,
    where a captured graph reads fixed addresses, their storage too, so that a model moved,
    cast or given new tensors (``cpu().cuda()``, ``half().float()``, ``load_state_dict(...,
    assign=True)``) never replays a graph on memory it no longer owns. (An in-place load keeps
    the storage: the graph reads the new values.)"""
    tensors = [*model.parameters(), *model.buffers()]
    if device == "cuda":
        return tuple((t.shape, t.dtype, t.device, t.untyped_storage().data_ptr()) for t in tensors)
    return tuple((t.shape, t.dtype, t.device) for t in tensors)


def _is_oom(e: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(e, oom) or "out of memory" in str(e).lower()


def step_runner(
    model: nn.Module,
    static: StaticState,
    tok: torch.Tensor,
    mode,
    values: torch.Tensor,
    compile_new: bool = True,
) -> StepRunner | None:
    """The compiled step for this configuration: kept on ``model`` from an earlier call (at most
    :data:`MAX_STEPS`, least recently used evicted), else compiled now when ``compile_new``
    (``tok``: a token batch of the right shape); None when there is none, or compiling this
    configuration failed (one warning says why; other configurations still compile; running out
    of memory is reported as such and tried again next time), so the caller decodes eagerly.
    ``mode``: :attr:`Sampling.mode`; ``values``: :meth:`Sampling.values` (what the compile
    runs with; a later call may pass others)."""
    device = static.pos.device.type
    config = _config_key(static, mode)
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
    runner = cls(model, mode, made)
    try:
        runner.warm_up(static, tok, values)
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


COMPILE_MIN_TOKENS = 1024
"""With ``compile=None``, the decode step is compiled for a generation of at least this many new
tokens (rows x max_new_tokens), or when this configuration was compiled earlier in the process;
shorter one-off generations decode eagerly, as compiling costs seconds (inductor, on the CPU and
before the CUDA graph capture alike; docs/generation.md)."""


def choose_step(
    model: nn.Module,
    static: StaticState,
    tok: torch.Tensor,
    sampling: Sampling,
    values: torch.Tensor,
    compile: bool | None,
    tokens: int,
) -> StepRunner | EagerStep:
    """The step a generation of ``tokens`` new tokens (rows x steps) runs, the one place that
    decides whether to compile: ``compile`` False, the eager step; True, the compiled step of
    this configuration (compiled now if need be); None (automatic), the compiled step when this
    configuration was compiled earlier in the process or ``tokens`` >= COMPILE_MIN_TOKENS, else
    the eager one. A configuration whose compile failed runs eagerly (:func:`step_runner`)."""
    if compile is not False:
        compile_new = bool(compile) if compile is not None else tokens >= COMPILE_MIN_TOKENS
        runner = step_runner(model, static, tok, sampling.mode, values, compile_new)
        if runner is not None:
            return runner
    return EagerStep(model, sampling.mode)


class Decoder:
    """The decode of one batch after its prefill: the states as fixed-shape buffers, the step
    that advances them (:func:`choose_step`: compiled or eager) and the sampling of each next
    token. Made by :meth:`start`; ``first`` is the batch's first ids (padded rows included),
    ``advance(ids)`` the ids after them, :meth:`swax_state` the state as a SwaxState."""

    def __init__(self, runner, static: StaticState, first, sampling: Sampling, values, generator):
        self.runner, self.static, self.first = runner, static, first
        self.sampling, self.values, self.generator = sampling, values, generator

    @classmethod
    def start(
        cls,
        model: nn.Module,
        parts: Sequence[tuple[SwaxState, Sequence[int]]],
        first: torch.Tensor,
        sampling: Sampling,
        compile: bool | None,
        steps: int,
        generator: torch.Generator | None = None,
        pad_to: int | None = None,
    ) -> Decoder:
        """Decode ``steps`` more ids after ``first`` (B,) for the rows of the prefilled states
        ``parts`` ((state, rows), as :meth:`StaticState.from_parts`). ``pad_to``: rows a
        compiled step runs (copies of row 0 beyond B, so that few batch sizes compile); an eager
        step runs the B rows alone."""
        B = len(first)
        rows = B if pad_to is None or compile is False else max(pad_to, B)
        capacity = capacity_for(max(st.pos for st, _ in parts) + steps)
        values = sampling.values(first.device)
        static, nxt = _padded(model, parts, first, rows, capacity)
        runner = choose_step(model, static, nxt, sampling, values, compile, rows * steps)
        if isinstance(runner, EagerStep) and rows > B:
            static, nxt = _padded(model, parts, first, B, capacity)
        return cls(runner, static, nxt, sampling, values, generator)

    def advance(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ``ids`` (B,) and return the next ones: the argmax, or a draw from the step's
        distribution with the generator."""
        out = self.runner.run(self.static, ids, self.values)
        return pick_after_step(out, self.sampling.mode, self.generator)

    def swax_state(self, model: nn.Module) -> SwaxState:
        return self.static.to_swax_state(model)


def _padded(model, parts, first: torch.Tensor, rows: int, capacity: int):
    """(StaticState of ``rows`` rows, their first ids): ``parts``' rows, then copies of row 0."""
    B = len(first)
    extra = []
    if rows > B:
        index = torch.zeros(rows - B, dtype=torch.long)
        extra = [(parts[0][0].select_rows(index), range(B, rows))]
    static = StaticState.from_parts(model, list(parts) + extra, capacity)
    return static, torch.cat([first, first[:1].expand(rows - B)])


def compile_seconds(model: nn.Module) -> float:
    """Seconds spent so far compiling decode steps for ``model`` in this process (the first
    call of each configuration), e.g. to keep them out of a tokens-per-second figure."""
    return model.__dict__.get("_swax_decode_compile_s", 0.0)
