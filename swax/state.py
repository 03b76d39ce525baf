"""The decode state of a SwaxLM: what one forward with ``return_state=True`` hands to the next.

Its own module so that the model and the generation loop both use it without importing each
other: ``swax.model`` builds and consumes states, ``swax.generate`` threads them through a
decoding loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


class _Default:
    def __repr__(self) -> str:
        return "<config.window>"


DEFAULT_WINDOW = _Default()
"""Sentinel: use ``config.window``. Pass ``window=None`` explicitly for full causal attention."""


def map_tensors(obj, fn):
    """``obj`` with ``fn`` applied to every tensor in it; tuples, lists and dataclasses are
    rebuilt around the results, other values kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(o, fn) for o in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj)}
        )
    return obj


def _rows(obj, index: torch.Tensor):
    """``obj`` with every tensor in it (batch first, as every layer state is) cut to rows
    ``index``."""
    return map_tensors(obj, lambda t: t.index_select(0, index.to(t.device)))


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(_tensor_bytes(o) for o in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(_tensor_bytes(getattr(obj, f)) for f in obj.__dataclass_fields__)
    return 0


@dataclass(frozen=True)
class SwaxState:
    """Per-layer decode states of a SwaxLM, plus the number of tokens consumed (``pos``) and
    the window the attention states were built for. Returned by ``forward(...,
    return_state=True)``; never mutated."""

    layers: tuple
    pos: int
    window: int | None

    def nbytes(self) -> int:
        """Bytes held by all state tensors (the decode memory besides the weights)."""
        return _tensor_bytes(self.layers)

    def select_rows(self, index: torch.Tensor) -> SwaxState:
        """The state of batch rows ``index`` (a 1-D LongTensor; rows may repeat), as beam
        search needs when it keeps, drops and copies sequences. A new state: this one is not
        modified."""
        return dataclasses.replace(self, layers=_rows(self.layers, index))
