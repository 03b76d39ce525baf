"""The decode state as fixed-shape buffers (:class:`StaticState`), what a decode step updates in
place.

After the (chunked, eager) prefill, :class:`StaticState` asks each layer's mixer for its state as
fixed-shape buffers (``decode_buffers``, the protocol of :mod:`swax.layers.base`): a ring of
W keys and values for a sliding-window layer, a buffer of ``capacity`` slots for full attention
(rounded up to a power of two, so that few sizes compile), the recurrent memories of the mLSTM
and Gated DeltaNet layers; plus the position of each row, a (B,) tensor: rows may sit at
different positions (batched decode of prompts of different lengths,
:func:`swax.generate.generate_batch`). :meth:`StaticState.to_swax_state` gives the state back
as a SwaxState (``return_state``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from swax.layers.base import NoStaticForm
from swax.state import SwaxState, map_tensors

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
