"""The compiled decode steps of a process, as one explicit object: :class:`StepCache`.

A step is compiled once per model and :class:`StepKey`, what changes its graph: the buffers'
shapes and dtypes (the batch size among them), the device, the window, the sampling mode, and
the weights' shapes, dtypes and devices (on CUDA their storage too, which a captured graph
reads). The cache holds at most ``max_steps`` per model, least recently used evicted, and holds
the model weakly: a model dropped by its user takes its steps with it. A configuration whose
compile failed is noted in one failure record, :data:`swax.ops.registry.FAILURES` (shared with
the op registry's kernels), and never tried again; running out of memory is not a failure of
the configuration and is tried again next time. :attr:`swax.decode.Decoder.steps` is the
process's cache.
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from swax.decode.static import StaticState
from swax.decode.steps import CudaGraphRunner, StepRunner, is_out_of_memory
from swax.ops.registry import FAILURES, FailureRecord

log = logging.getLogger("swax")

MAX_STEPS = 8
"""Compiled steps kept per model (each holds its graph and, on CUDA, buffers of its own); the
least recently used goes first."""


class StepKey(NamedTuple):
    """What changes a model's compiled step: ``buffers`` (shape, dtype) of every buffer of the
    StaticState, the positions last; ``device`` (type, index); the ``window`` the buffers were
    built for; the sampling ``mode`` (:attr:`swax.sampling.Sampling.mode`); ``weights``
    (:func:`weights_key`)."""

    buffers: tuple
    device: tuple
    window: object
    mode: object
    weights: tuple

    @property
    def batch(self) -> int:
        """Rows of the step (the length of the positions)."""
        return self.buffers[-1][0][0]

    def configuration(self) -> tuple:
        """The key without the weights: what a failed compile is noted under (in any model)."""
        return ("decode step", self.device[0], tuple(self[:4]))


def weights_key(model: nn.Module, device: str) -> tuple:
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


def step_key(model: nn.Module, static: StaticState, mode) -> StepKey:
    device = static.pos.device
    return StepKey(
        tuple((tuple(t.shape), t.dtype) for t in static.tensors()),
        (device.type, device.index),
        static.window,
        mode,
        weights_key(model, device.type),
    )


@dataclass
class _Held:
    """One model's steps, oldest first, and the seconds spent compiling them."""

    steps: OrderedDict = field(default_factory=OrderedDict)
    compile_s: float = 0.0


class StepCache:
    """The compiled decode steps, one per (model, :class:`StepKey`); see the module docstring.
    ``failures``: where failed compiles are noted (the process's record unless given another,
    e.g. a test's)."""

    def __init__(self, max_steps: int = MAX_STEPS, failures: FailureRecord | None = None):
        self.max_steps = max_steps
        self.failures = FAILURES if failures is None else failures
        self._held: weakref.WeakKeyDictionary[nn.Module, _Held] = weakref.WeakKeyDictionary()
        self._made = 0

    def keys(self, model: nn.Module) -> list[StepKey]:
        """The keys of ``model``'s steps, least recently used first."""
        held = self._held.get(model)
        return list(held.steps) if held is not None else []

    def compile_seconds(self, model: nn.Module) -> float:
        """Seconds spent compiling steps for ``model`` (evicted ones included)."""
        held = self._held.get(model)
        return held.compile_s if held is not None else 0.0

    def get(
        self,
        model: nn.Module,
        static: StaticState,
        tok: torch.Tensor,
        mode,
        values: torch.Tensor,
        compile_new: bool = True,
    ) -> StepRunner | None:
        """The compiled step of ``model`` for ``static`` and ``mode``: the one kept from an
        earlier call, else one compiled now when ``compile_new`` (``tok``: a token batch of the
        right shape; ``values``: :meth:`~swax.sampling.Sampling.values`, what the compile runs
        with, a later call may pass others). None when there is none, or compiling this
        configuration failed (one warning says why; other configurations still compile), so
        the caller decodes eagerly."""
        key = step_key(model, static, mode)
        if self.failures.why(key.configuration()) is not None:
            return None
        held = self._held.setdefault(model, _Held())
        runner = held.steps.get(key)
        if runner is not None:
            held.steps.move_to_end(key)
            return runner
        if not compile_new:
            return None
        runner = self._compile(model, static, tok, values, key)
        if runner is not None:
            held.steps[key] = runner
            held.compile_s += runner.compile_s
            while len(held.steps) > self.max_steps:
                held.steps.popitem(last=False)
        return runner

    def _compile(self, model, static, tok, values, key: StepKey) -> StepRunner | None:
        """A new runner for ``key``, warmed up (compiled); None, with one warning, if that
        failed."""
        device = key.device[0]
        cls = CudaGraphRunner if device == "cuda" else StepRunner
        runner = cls(key.mode, self._made)
        self._made += 1  # each step its own code object, named by this count
        try:
            runner.warm_up(model, static, tok, values)
        except Exception as e:  # noqa: BLE001 - any compile failure: decode eagerly, never crash
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            if is_out_of_memory(e):
                log.warning(
                    "swax: out of memory compiling the decode step for batch %d on %s (%s); "
                    "decoding eagerly this time",
                    key.batch,
                    device,
                    why,
                )
                return None
            self.failures.note(key.configuration(), why)
            log.warning(
                "swax: compiling the decode step failed on %s for batch %d (%s); decoding this "
                "configuration eagerly (compile=False / --no-compile skips the attempt)",
                device,
                key.batch,
                why,
            )
            return None
        log.info(
            "swax: compiled the decode step for batch %d in %.1f s", key.batch, runner.compile_s
        )
        return runner
