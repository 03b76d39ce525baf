"""What every token mixer provides: a sequence forward and one single-token decode step.

A mixer (one per layer kind, ``swax.model.MIXERS``) is an ``nn.Module`` with

- ``forward(x (B, T, d), window, state=None, return_state=False, doc_ids=None)``: the sequence
  path (training, prefill), a state in and out (the layer's part of a
  :class:`~swax.state.SwaxState`: any tuple or dataclass of batch-first tensors);
- ``decode_buffers(state, capacity)``: that state as a tuple of fresh fixed-shape tensors, batch
  first (``capacity``: slots for a buffer that grows with the context, above every position to
  come); raises :class:`NoStaticForm` when the state has none;
- ``step(x (B, d), buffers, pos (B,))``: one token per row, each row at its own position,
  updating ``buffers`` in place; no shape depends on ``pos`` and nothing reads a value back to
  the host, so the step compiles to one graph (torch.compile, CUDA graphs);
- ``decode_state(buffers, pos, window)``: the buffers back as the layer's state after ``pos``
  tokens (views of ``buffers``, not copies), ``window`` this layer's window.

``step`` is the only single-token implementation of a layer kind: the forward of one token on a
state goes through it (:meth:`TokenMixer.forward_one`), and :mod:`swax.decode` builds, steps and
returns the buffers of every layer through these methods without knowing the layer kinds. A
recurrent mixer's state is already fixed-size: the defaults below copy it as it is.
"""

from __future__ import annotations

import torch
from torch import nn


class NoStaticForm(ValueError):
    """A layer state that fixed-shape decode buffers cannot hold (e.g. a state whose buffer
    would need more slots than the capacity)."""


class TokenMixer(nn.Module):
    """Base of the token mixers: the decode protocol of the module docstring. Subclasses
    implement ``forward`` and ``step``; a recurrent mixer whose state is a tuple of fixed-size
    tensors keeps the defaults of :meth:`decode_buffers` and :meth:`decode_state`."""

    def decode_buffers(self, state, capacity: int) -> tuple[torch.Tensor, ...]:
        """Fresh buffers holding ``state`` (default: a copy of each tensor of the tuple)."""
        return tuple(t.clone() for t in state)

    def decode_state(self, buffers: tuple[torch.Tensor, ...], pos: int, window):
        """The layer state the buffers hold after ``pos`` tokens (default: the tuple itself)."""
        return tuple(buffers)

    def step(self, x: torch.Tensor, buffers: tuple, pos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no decode step")

    def forward_one(self, x: torch.Tensor, state, pos: int, window):
        """The forward of one token (x (B, 1, d)) on ``state`` after ``pos`` tokens, through
        :meth:`step`: (y (B, 1, d), the new state). ``state`` is left as it was."""
        buffers = self.decode_buffers(state, pos + 1)
        at = torch.full((x.shape[0],), pos, dtype=torch.long, device=x.device)
        y = self.step(x[:, 0], buffers, at)
        return y[:, None], self.decode_state(buffers, pos + 1, window)
