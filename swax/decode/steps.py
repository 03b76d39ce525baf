"""The decode step, and the objects that run it: eagerly, compiled, or compiled and captured in a
CUDA graph.

One step (:func:`decode_step`: every block's ``step``, then the head, :func:`decode_logits`)
updates the buffers of a :class:`~swax.decode.static.StaticState` in place, so no shape depends
on the position. The next token is picked by :mod:`swax.sampling`, the one module that picks:
inside the step :func:`~swax.sampling.pick_in_step` (the argmax, or the temperature / top-k /
top-p distribution, whose temperature and top-p are tensors: one graph serves every value), then
outside it :func:`~swax.sampling.pick_after_step` (the distribution's one draw, from the
caller's seeded generator). The eager reference (:class:`EagerStep`) runs that same function
uncompiled; :class:`StepRunner` runs it under ``torch.compile`` (inductor) and
:class:`CudaGraphRunner` captures the inductor-compiled step in a CUDA graph. Every runner takes
the model at each call and keeps no reference to it, so a cache of runners
(:class:`~swax.decode.cache.StepCache`) never keeps a model alive.
"""

from __future__ import annotations

import logging
import os
import time
import types
from collections.abc import Callable

import torch
from torch import nn

from swax.decode.static import StaticState
from swax.sampling import pick_in_step

log = logging.getLogger("swax")


def decode_logits(model: nn.Module, layers, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Feed ``tok`` (B,) at positions ``pos`` (B,) through ``model`` on the buffers ``layers``
    (updated in place, ``pos`` incremented); return the next logits (B, vocab) in float32."""
    x = model.embed(tok)
    for block, buffers in zip(model.blocks, layers):
        x = block.step(x, buffers, pos)
    logits = model.logits(model.norm(x)).float()
    pos.add_(1)
    return logits


def decode_step(model, layers, tok, pos, mode, values):
    """One step: the next token (B,) for greedy decoding (``mode`` None), else the
    distribution to draw it from (B, vocab)."""
    return pick_in_step(decode_logits(model, layers, tok, pos), mode, values)


class EagerStep:
    """The step uncompiled: the reference every compiled step is held to, and what runs when
    nothing is compiled. ``run(model, static, tok, values)`` advances ``static`` by ``tok``
    (B,) and returns what :func:`decode_step` returns."""

    compile_s = 0.0

    def __init__(self, mode):
        self.mode = mode

    def run(self, model: nn.Module, static: StaticState, tok, values) -> torch.Tensor:
        return decode_step(model, static.layers, tok, static.pos, self.mode, values)


# ------------------------------------------------------------------------------ compiled steps

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


def _own_code(fn: Callable, n: int) -> Callable:
    """A copy of ``fn`` with a code object of its own. torch._dynamo keeps its compiled graphs,
    and counts its recompile limit, per code object: compiled from its own copy, each step is
    the one graph of its own dynamo cache, which no other configuration (or model) evicts or
    fills, and which guard evaluation finds at once. So what is kept is decided by one cache,
    :class:`~swax.decode.cache.StepCache`, not by dynamo's."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{n}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _compiled(n: int, cpu: bool):
    """:func:`decode_step` under torch.compile with its own code object (C++ wrapper on the
    CPU)."""
    backend = compile_backend()
    options = INDUCTOR_OPTIONS if backend == "inductor" and cpu else None
    return torch.compile(
        _own_code(decode_step, n), fullgraph=True, dynamic=False, backend=backend, options=options
    )


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the device ran out of memory (worth trying again later)."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(e, oom) or "out of memory" in str(e).lower()


class StepRunner:
    """One compiled decode step of one configuration, the ``n``-th the cache made (its code
    object's name). ``warm_up`` compiles it; ``run(model, static, tok, values)`` advances
    ``static`` (a StaticState of that configuration) by ``tok`` (B,) and returns what
    :func:`decode_step` returns. ``compile_s``: seconds the compile took (the first call's
    cost)."""

    def __init__(self, mode, n: int):
        self.mode = mode
        self.fn = _compiled(n, cpu=True)
        self.compile_s = 0.0

    def warm_up(self, model: nn.Module, static: StaticState, tok, values) -> None:
        """Compile on copies of the buffers (a failing compile touches no real state)."""
        copies = [tuple(t.clone() for t in bufs) for bufs in static.layers]
        t0 = time.perf_counter()
        self.fn(model, copies, tok.clone(), static.pos.clone(), self.mode, values)
        self.compile_s = time.perf_counter() - t0

    def run(self, model: nn.Module, static: StaticState, tok, values) -> torch.Tensor:
        return self.fn(model, static.layers, tok, static.pos, self.mode, values)


class CudaGraphRunner(StepRunner):
    """The step compiled by inductor, then captured in a CUDA graph on buffers of its own (as
    gpt-fast's "reduce-overhead", with the graph and its buffers owned here: docs/design.md says
    why): ``run`` copies the state in when it is a new one, copies the token and the sampling
    values into the graph's inputs, replays the graph, and leaves the state in the graph's
    buffers (``static`` is rebound to them). If inductor cannot compile the step, the eager step
    is captured instead (one warning). The cache keys it on the weights' storage
    (:func:`~swax.decode.cache.weights_key`), so it never replays on memory the model no longer
    owns."""

    def __init__(self, mode, n: int):
        self.mode, self.n, self.compile_s = mode, n, 0.0
        self.graph, self.static, self.out = None, None, None

    def warm_up(self, model: nn.Module, static: StaticState, tok, values) -> None:
        t0 = time.perf_counter()
        mine = StaticState(
            [tuple(t.clone() for t in b) for b in static.layers], static.pos.clone(), static.window
        )
        self.tok, self.values = tok.clone(), values.clone()
        fn = _compiled(self.n, cpu=False)
        try:
            self._run_aside(fn, model, mine)
        except Exception as e:  # noqa: BLE001 - capture the eager step instead
            if is_out_of_memory(e):
                raise
            log.warning(
                "swax: inductor could not compile the CUDA decode step (%s: %s); capturing the "
                "eager step",
                type(e).__name__,
                str(e).splitlines()[0][:160] if str(e) else "",
            )
            fn = decode_step
            self._run_aside(fn, model, mine)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(model, mine.layers, self.tok, mine.pos, self.mode, self.values)
        self.static = mine
        torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - t0

    def _run_aside(self, fn, model: nn.Module, mine: StaticState) -> None:
        """Run ``fn`` on scratch copies on a side stream: compilation, autotuning, lazy
        allocations and workspace set-up happen before the capture."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                scratch = [tuple(t.clone() for t in b) for b in mine.layers]
                fn(model, scratch, self.tok, mine.pos.clone(), self.mode, self.values)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def run(self, model: nn.Module, static: StaticState, tok, values) -> torch.Tensor:
        if static is not self.static:  # a new generation: its state into the graph's buffers
            for dst, src in zip(self.static.tensors(), static.tensors()):
                dst.copy_(src)
            static.layers, static.pos = self.static.layers, self.static.pos
            self.static = static
        self.tok.copy_(tok)
        self.values.copy_(values)
        self.graph.replay()
        return self.out.clone()
