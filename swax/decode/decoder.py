"""The decode of one batch after its prefill (:class:`Decoder`), and the one decision whether its
step is compiled (:func:`choose_step`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from swax.decode.cache import StepCache
from swax.decode.static import StaticState, capacity_for
from swax.decode.steps import EagerStep, StepRunner
from swax.sampling import Sampling, pick_after_step
from swax.state import SwaxState

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
    cache: StepCache,
) -> StepRunner | EagerStep:
    """The step a generation of ``tokens`` new tokens (rows x steps) runs, the one place that
    decides whether to compile: ``compile`` False, the eager step; True, the compiled step of
    this configuration from ``cache`` (compiled now if need be); None (automatic), the compiled
    step when ``cache`` holds this configuration's or ``tokens`` >= COMPILE_MIN_TOKENS, else the
    eager one. A configuration whose compile failed runs eagerly (:meth:`StepCache.get`)."""
    if compile is not False:
        compile_new = bool(compile) if compile is not None else tokens >= COMPILE_MIN_TOKENS
        runner = cache.get(model, static, tok, sampling.mode, values, compile_new)
        if runner is not None:
            return runner
    return EagerStep(sampling.mode)


class Decoder:
    """The decode of one batch after its prefill: the states as fixed-shape buffers, the step
    that advances them (:func:`choose_step`: compiled or eager) and the sampling of each next
    token. Made by :meth:`start`; ``first`` is the batch's first ids (padded rows included),
    ``advance(ids)`` the ids after them, :meth:`swax_state` the state as a SwaxState.

    :attr:`step_cache` holds the compiled steps of every decoder of the process (a
    :class:`~swax.decode.cache.StepCache`; :meth:`start` takes another, e.g. a test's)."""

    step_cache: StepCache = StepCache()

    def __init__(self, model: nn.Module, runner, static: StaticState, first, sampling, values, gen):
        self.model, self.runner, self.static, self.first = model, runner, static, first
        self.sampling, self.values, self.generator = sampling, values, gen

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
        step_cache: StepCache | None = None,
    ) -> Decoder:
        """Decode ``steps`` more ids after ``first`` (B,) for the rows of the prefilled states
        ``parts`` ((state, rows), as :meth:`StaticState.from_parts`). ``pad_to``: rows a
        compiled step runs (copies of row 0 beyond B, so that few batch sizes compile); an eager
        step runs the B rows alone. ``step_cache``: where compiled steps are looked up and kept
        (default: :attr:`step_cache`)."""
        cache = cls.step_cache if step_cache is None else step_cache
        B = len(first)
        rows = B if pad_to is None or compile is False else max(pad_to, B)
        capacity = capacity_for(max(st.pos for st, _ in parts) + steps)
        values = sampling.values(first.device)
        static, nxt = _padded(model, parts, first, rows, capacity)
        runner = choose_step(model, static, nxt, sampling, values, compile, rows * steps, cache)
        if isinstance(runner, EagerStep) and rows > B:
            static, nxt = _padded(model, parts, first, B, capacity)
        return cls(model, runner, static, nxt, sampling, values, generator)

    def advance(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ``ids`` (B,) and return the next ones: the argmax, or a draw from the step's
        distribution with the generator."""
        out = self.runner.run(self.model, self.static, ids, self.values)
        return pick_after_step(out, self.sampling.mode, self.generator)

    def swax_state(self, model: nn.Module | None = None) -> SwaxState:
        """The state after the ids fed so far, as a SwaxState (copies)."""
        return self.static.to_swax_state(self.model if model is None else model)


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
    call of each configuration, in :attr:`Decoder.step_cache`), e.g. to keep them out of a
    tokens-per-second figure."""
    return Decoder.step_cache.compile_seconds(model)
