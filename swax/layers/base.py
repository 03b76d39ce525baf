"""What every token mixer provides: a sequence forward and one single-token decode step.

A mixer (one per layer kind, :data:`swax.config.LAYER_KINDS`) is a :class:`TokenMixer`: an
``nn.Module`` that implements

- ``reset_parameters(std, out_std)``: its initialisation (``out_std`` for the projection that
  writes to the residual stream), the only one :class:`swax.model.SwaxLM` calls;
- ``sequence(x (B, T, d), window, state, return_state, doc_ids)``: the sequence path (training,
  prefill), a state in and out (the layer's part of a :class:`~swax.state.SwaxState`: any tuple
  or dataclass of batch-first tensors), returning (y, new state or None);
- ``step(x (B, d), buffers, pos (B,))``: one token per row, each row at its own position,
  updating the decode ``buffers`` in place; no shape depends on ``pos`` and nothing reads a
  value back to the host, so the step compiles to one graph (torch.compile, CUDA graphs);

and, unless its state is a tuple of fixed-size tensors (the defaults copy it as it is):

- ``decode_buffers(state, capacity)``: that state as a tuple of fresh fixed-shape tensors, batch
  first (``capacity``: slots for a buffer that grows with the context, above every position to
  come); raises :class:`NoStaticForm` when the state has none;
- ``decode_state(buffers, pos, window)``: the buffers back as the layer's state after ``pos``
  tokens (views of ``buffers``, not copies), ``window`` this layer's window;
- ``check_state(state, window, doc_ids, T)`` and ``state_pos(state)``: what a state allows and
  how many tokens it has seen (attention's states know their position; recurrent ones need not);
- ``mixing_flops(seq_len, window)``: FLOPs per token of the mixing beyond the weight matrices.

``forward`` is written once, here: one token on a state goes through ``step`` (so ``step`` is a
layer kind's only single-token code), anything else through ``sequence``. :mod:`swax.decode`
builds, steps and returns the buffers of every layer through these methods without knowing the
layer kinds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from swax.ops.precision import autocast_off


def gate_linear(lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``lin(x)`` in float32 whatever the autocast or the weights' dtype, for the small
    projections (d_model -> heads) whose outputs feed exponentials (the mLSTM's input and
    forget gates, Gated DeltaNet's decay and write strength): rounded to bfloat16, a gate
    pre-activation near -10 moves by 1/32 and its exponential by 3 %. The same operation as
    ``lin(x)`` for float32 weights and inputs outside autocast. A module other than
    ``nn.Linear`` (swax.quant's int8 or bfloat16 weights, which compute in float32) is called on
    x in float32."""
    with autocast_off(x):
        if not isinstance(lin, nn.Linear):
            return lin(x.float())
        b = None if lin.bias is None else lin.bias.float()
        return F.linear(x.float(), lin.weight.float(), b)


class NoStaticForm(ValueError):
    """A layer state that fixed-shape decode buffers cannot hold (e.g. a state whose buffer
    would need more slots than the capacity)."""


class TokenMixer(nn.Module):
    """Base of the token mixers: the protocol of the module docstring. Subclasses implement
    ``reset_parameters``, ``sequence`` and ``step``."""

    def forward(
        self, x: torch.Tensor, window=None, state=None, return_state: bool = False, doc_ids=None
    ):
        """x (B, T, d_model) -> y (B, T, d_model) [, the new state]. One token on a state runs
        :meth:`step` (:meth:`forward_one`), anything else :meth:`sequence`. ``doc_ids`` (B, T):
        packed documents (see :mod:`swax.ops.packing`), not with a state."""
        self.check_state(state, window, doc_ids, x.shape[1])
        if state is not None and x.shape[1] == 1 and doc_ids is None:
            y, new_state = self.forward_one(x, state, self.state_pos(state), window)
        else:
            y, new_state = self.sequence(x, window, state, return_state, doc_ids)
        return (y, new_state) if return_state else y

    def reset_parameters(self, std: float, out_std: float) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no reset_parameters")

    def sequence(self, x: torch.Tensor, window, state, return_state: bool, doc_ids):
        raise NotImplementedError(f"{type(self).__name__} has no sequence forward")

    def step(self, x: torch.Tensor, buffers: tuple, pos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no decode step")

    def check_state(self, state, window, doc_ids, T: int) -> None:
        """Raise ValueError when ``state`` cannot continue with these arguments (default: a
        state with packed documents)."""
        if doc_ids is not None and state is not None:
            raise ValueError("doc_ids cannot be combined with a decode state")

    def state_pos(self, state) -> int:
        """Tokens ``state`` has seen, as :meth:`step` needs it (default 0: a recurrent state
        does not depend on the position)."""
        return 0

    def mixing_flops(self, seq_len: int, window) -> float:
        """Forward FLOPs per token of the token mixing beyond the weight matrices (which
        :meth:`swax.model.SwaxLM.flops_per_token` counts from the parameters), averaged over a
        sequence of ``seq_len`` tokens with attention ``window`` (default 0)."""
        return 0.0

    def decode_buffers(self, state, capacity: int) -> tuple[torch.Tensor, ...]:
        """Fresh buffers holding ``state`` (default: a copy of each tensor of the tuple)."""
        return tuple(t.clone() for t in state)

    def decode_state(self, buffers: tuple[torch.Tensor, ...], pos: int, window):
        """The layer state the buffers hold after ``pos`` tokens (default: the tuple itself)."""
        return tuple(buffers)

    def forward_one(self, x: torch.Tensor, state, pos: int, window):
        """The forward of one token (x (B, 1, d)) on ``state`` after ``pos`` tokens, through
        :meth:`step`: (y (B, 1, d), the new state). ``state`` is left as it was."""
        buffers = self.decode_buffers(state, pos + 1)
        at = torch.full((x.shape[0],), pos, dtype=torch.long, device=x.device)
        y = self.step(x[:, 0], buffers, at)
        return y[:, None], self.decode_state(buffers, pos + 1, window)


def recurrent_mixing_flops(heads: int, dqk: float, dv: float, chunk: int, seq_len: int) -> float:
    """Mixing FLOPs per token of a chunkwise linear recurrence (mLSTM, Gated DeltaNet) of
    ``heads`` state heads with key and value widths ``dqk`` and ``dv`` per head: the state
    update and readout (4·Dqk·Dv per head) and the intra-chunk part (about 2·(Dqk + Dv)·chunk
    per head)."""
    return heads * (4.0 * dqk * dv + 2.0 * (dqk + dv) * min(chunk, seq_len))
