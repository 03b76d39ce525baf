"""The fixed-shape decode of :func:`swax.generate.generate`: one step, compiled or not.

A SWAX model's decode state never grows, so every decode step has the same shapes. The package,
bottom to top:

- :mod:`~swax.decode.static`: :class:`StaticState`, the states of a batch as fixed-shape buffers
  (each layer's mixer gives its own through the protocol of :mod:`swax.layers.base`: this package
  never looks at the layer kinds, so a new mixer that implements the protocol decodes here
  unchanged), with a position per row.
- :mod:`~swax.decode.steps`: the step (:func:`decode_step`: every block's ``step``, the head,
  and the pick, from :mod:`swax.sampling`), run eagerly (:class:`EagerStep`, the reference),
  under ``torch.compile`` (:class:`StepRunner`, inductor with its C++ wrapper on the CPU) or
  compiled and captured in a CUDA graph (:class:`CudaGraphRunner`).
- :mod:`~swax.decode.cache`: :class:`StepCache`, the compiled steps as one object, keyed by what
  changes the graph (:class:`StepKey`), bounded per model, with one record of failed compiles.
- :mod:`~swax.decode.decoder`: :class:`Decoder`, one batch's decode after its prefill (its
  buffers, its step, its sampling), holding the process's :class:`StepCache`
  (:attr:`Decoder.step_cache`); :func:`choose_step`, the one decision whether to compile.
"""

from swax.decode.cache import MAX_STEPS, StepCache, StepKey, weights_key
from swax.decode.decoder import COMPILE_MIN_TOKENS, Decoder, choose_step, compile_seconds
from swax.decode.static import MIN_CAPACITY, StaticState, capacity_for
from swax.decode.steps import (
    BACKEND,
    BACKEND_ENV,
    INDUCTOR_OPTIONS,
    CudaGraphRunner,
    EagerStep,
    StepRunner,
    compile_backend,
    decode_logits,
    decode_step,
)
from swax.sampling import Sampling

__all__ = [
    "BACKEND",
    "BACKEND_ENV",
    "COMPILE_MIN_TOKENS",
    "INDUCTOR_OPTIONS",
    "MAX_STEPS",
    "MIN_CAPACITY",
    "CudaGraphRunner",
    "Decoder",
    "EagerStep",
    "Sampling",
    "StaticState",
    "StepCache",
    "StepKey",
    "StepRunner",
    "capacity_for",
    "choose_step",
    "compile_backend",
    "compile_seconds",
    "decode_logits",
    "decode_step",
    "weights_key",
]
