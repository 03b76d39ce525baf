"""Attention token mixers: ``SlidingWindowAttention`` (layer letter ``S``) and ``FullAttention``
(``A``), with rotary positions, grouped-query attention, optional qk-norm and a decode state.

Decode state (:class:`AttentionState`): for a sliding window W, a **ring buffer** of the last W
keys and values (key at absolute position p lives in slot p mod W), so its size never grows;
for full attention, a growing cache. Keys are cached after RoPE, so the order inside the ring
does not matter for a single-token step. Recurrent states elsewhere are float32; the KV caches
hold keys/values in the model's compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from swax.layers.base import NoStaticForm, TokenMixer
from swax.ops import apply_rope, sliding_window_attention
from swax.ops.packing import doc_positions
from swax.ops.rope import apply_rope_at


@dataclass(frozen=True)
class AttentionState:
    """Keys/values seen so far by one attention layer.

    k, v: (B, Hkv, S, D). With ``window`` set, S == window and the tensors are a ring buffer
    (absolute position p in slot p % window); with ``window=None`` they hold all ``pos`` keys
    in order. ``pos``: the number of tokens consumed so far (the next token's position).
    """

    k: torch.Tensor
    v: torch.Tensor
    pos: int
    window: int | None
    doc_start: torch.Tensor | None = None
    """After a packed prefill (doc_ids): (B,) absolute position where each row's last document
    starts; decoding continues that document (earlier keys masked, RoPE counted from it)."""

    def chronological(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values still inside the window, oldest first."""
        if self.window is None or self.pos <= self.window:
            n = self.pos if self.window is None else min(self.pos, self.window)
            return self.k[:, :, :n], self.v[:, :, :n]
        shift = -(self.pos % self.window)
        return self.k.roll(shift, dims=2), self.v.roll(shift, dims=2)


def _to_ring(k: torch.Tensor, v: torch.Tensor, end: int, window: int):
    """Ring buffers of size ``window`` holding the last keys of the chronological k, v whose
    final key sits at absolute position end - 1."""
    m = min(window, k.shape[2])
    k, v = k[:, :, -m:], v[:, :, -m:]
    if m == window:
        s = (end - m) % window
        return k.roll(s, dims=2), v.roll(s, dims=2)
    # fewer than `window` tokens seen in total: positions 0 … m - 1 sit in slots 0 … m - 1
    B, H, _, D = k.shape
    rk = k.new_zeros(B, H, window, D)
    rv = v.new_zeros(B, H, window, v.shape[-1])
    rk[:, :, :m] = k
    rv[:, :, :m] = v
    return rk, rv


class _Attention(TokenMixer):
    sliding: bool = True

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        rope: bool = True,
        rope_base: float = 10000.0,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        backend: str | None = None,
    ):
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        head_dim = head_dim or d_model // n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.rope, self.rope_base, self.backend = rope, rope_base, backend
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=False)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm_weight = nn.Parameter(torch.ones(head_dim))
            self.k_norm_weight = nn.Parameter(torch.ones(head_dim))
        self.norm_eps = norm_eps

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        """Normal(0, std) q, k and v projections; the output projection, which writes to the
        residual stream, Normal(0, out_std); the q/k norms' scales at 1."""
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.normal_(proj.weight, std=std)
        nn.init.normal_(self.o_proj.weight, std=out_std)
        if self.qk_norm:
            self.q_norm_weight.fill_(1.0)
            self.k_norm_weight.fill_(1.0)

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), w.float(), self.norm_eps).to(x.dtype)

    def check_state(self, state, window, doc_ids, T: int) -> None:
        """The window must be the one the state was built for; a state after tokens takes no
        packed documents, and a state after a packed prefill continues one token at a time."""
        w = window if self.sliding else None
        if state is None:
            return
        if state.window != w:
            raise ValueError(
                f"decode state was built for window {state.window}, but window {w} was given"
            )
        if doc_ids is not None and state.pos > 0:
            raise ValueError("doc_ids cannot be combined with a decode state")
        if state.doc_start is not None and T != 1:
            raise ValueError(
                "a state after a packed prefill (doc_ids) continues one token at a time, "
                f"got {T} tokens"
            )

    def state_pos(self, state: AttentionState) -> int:
        return state.pos

    def sequence(self, x: torch.Tensor, window, state, return_state: bool, doc_ids):
        """x: (B, T, d_model) -> (y (B, T, d_model), new AttentionState or None). ``window`` is
        ignored by full attention; ``doc_ids`` (B, T): packed documents (see
        :mod:`swax.ops.packing`)."""
        B, T, _ = x.shape
        w = window if self.sliding else None
        if doc_ids is not None:
            return self._forward_docs(x, w, return_state, doc_ids)
        pos = 0 if state is None else state.pos
        q, k, v = self._qkv(x, offset=pos)
        new_state = None
        if state is not None and pos > 0:
            ck, cv = state.chronological()
            k, v = torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)
        o = sliding_window_attention(q, k, v, w, backend=self.backend)
        if return_state:
            if w is None:
                new_state = AttentionState(k, v, pos + T, None)
            else:
                new_state = AttentionState(*_to_ring(k, v, pos + T, w), pos + T, w)
        return self._out(o), new_state

    def mixing_flops(self, seq_len: int, window) -> float:
        """QKᵀ and PV (4·heads·head_dim per visible key) over the average number of keys a query
        sees in a sequence of ``seq_len`` (the window, or every earlier token)."""
        T = seq_len
        W = T if (not self.sliding or window is None) else min(window, T)
        avg_keys = (W * (W + 1) / 2 + (T - W) * W) / T
        return 4.0 * self.n_heads * self.head_dim * avg_keys

    # ------------------------------------------------------------------ decode (TokenMixer)
    def decode_buffers(self, state: AttentionState, capacity: int) -> tuple[torch.Tensor, ...]:
        """(k, v [, doc_start]): a copy of the ring of W slots (sliding window), or a buffer of
        ``capacity`` slots holding the ``pos`` keys in order (full attention); after a packed
        prefill, each row's document start (B,) as a third buffer."""
        if state.window is not None:
            k, v = state.k.clone(), state.v.clone()
        else:
            if state.pos > capacity:
                raise NoStaticForm(f"position {state.pos} exceeds the capacity {capacity}")
            B, H, _, D = state.k.shape
            k = state.k.new_zeros(B, H, capacity, D)
            v = state.v.new_zeros(B, H, capacity, state.v.shape[-1])
            k[:, :, : state.pos] = state.k
            v[:, :, : state.pos] = state.v
        if state.doc_start is None:
            return k, v
        return k, v, state.doc_start.clone()

    def decode_state(self, buffers, pos: int, window) -> AttentionState:
        w = window if self.sliding else None
        k, v = buffers[:2]
        if w is None:
            k, v = k[:, :, :pos], v[:, :, :pos]
        start = buffers[2] if len(buffers) > 2 else None
        return AttentionState(k, v, pos, w, start)

    def step(self, x: torch.Tensor, buffers: tuple, pos: torch.Tensor) -> torch.Tensor:
        """One decode token per row, each at its own position, on fixed-shape buffers.

        x: (B, d_model). ``buffers`` (k, v [, doc_start]) from :meth:`decode_buffers`: (B, Hkv,
        R, D) buffers, the key of absolute position p in slot p % R (R: the window, or for full
        attention a capacity above every position), and after a packed prefill each row's
        document start (B,) (RoPE counts from it, earlier keys are masked). pos: (B,) int64,
        the position of this token in each row. Writes the new key and value into slot pos % R
        (in place) and attends to the slots holding positions max(0, start, pos - R + 1) … pos
        (a validity mask; no shape depends on pos). Returns (B, d_model).
        """
        k_buf, v_buf = buffers[:2]
        start = buffers[2] if len(buffers) > 2 else None
        B, R = x.shape[0], k_buf.shape[2]
        at = pos if start is None else pos - start
        q, k, v = self._qkv(x[:, None], positions=at[:, None], checked=False)
        rows = torch.arange(B, device=x.device)[:, None]
        heads = torch.arange(self.n_kv_heads, device=x.device)[None, :]
        slot = (pos % R)[:, None]
        k_buf.index_put_((rows, heads, slot), k[:, :, 0])  # (B, Hkv) index pairs, in place
        v_buf.index_put_((rows, heads, slot), v[:, :, 0])
        j = torch.arange(R, device=x.device)[None, :]
        if start is None:
            valid = j <= pos[:, None]  # (B, R)
        else:  # the newest position in slot j, at or after the row's document start
            valid = pos[:, None] - (pos[:, None] - j) % R >= start[:, None]
        o = F.scaled_dot_product_attention(
            q, k_buf, v_buf, valid[:, None, None, :], enable_gqa=self.n_heads != self.n_kv_heads
        )  # (B, Hq, 1, Dv)
        return self._out(o)[:, 0]

    def _qkv(
        self,
        x: torch.Tensor,
        offset: int = 0,
        positions: torch.Tensor | None = None,
        checked: bool = True,
    ):
        """q (B, Hq, T, D), k and v (B, Hkv, T, D), RoPE at offset … offset + T - 1 or at
        ``positions`` (B, T) (``checked=False``: no check that reads their values)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self._norm(q, self.q_norm_weight), self._norm(k, self.k_norm_weight)
        if self.rope and not checked:
            q, k = (
                apply_rope_at(q, positions, self.rope_base),
                apply_rope_at(k, positions, self.rope_base),
            )
        elif self.rope:
            q = apply_rope(q, offset, self.rope_base, positions=positions)
            k = apply_rope(k, offset, self.rope_base, positions=positions)
        return q, k, v

    def _out(self, o: torch.Tensor) -> torch.Tensor:
        """The output projection of the heads' outputs o (B, Hq, T, D) -> (B, T, d_model)."""
        B, _, T, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def _forward_docs(self, x, w, return_state, doc_ids):
        """A packed prefill (doc_ids); its state continues each row's last document."""
        B, T, _ = x.shape
        q, k, v = self._qkv(x, positions=doc_positions(doc_ids))
        o = sliding_window_attention(q, k, v, w, backend=self.backend, doc_ids=doc_ids)
        new_state = None
        if return_state:
            t = torch.arange(T, device=x.device)
            last = doc_ids == doc_ids[:, -1:]
            start = torch.where(last, t, torch.full_like(t, T)).min(dim=1).values
            ring = (k, v) if w is None else _to_ring(k, v, T, w)
            new_state = AttentionState(*ring, T, w, start)
        return self._out(o), new_state


class SlidingWindowAttention(_Attention):
    """Causal softmax attention over the last ``window`` tokens (a forward argument), with RoPE.

    Args: d_model; n_heads query heads; n_kv_heads (GQA, default n_heads); head_dim (default
    d_model // n_heads); rope / rope_base; qk_norm (RMSNorm on q and k per head); backend
    (a name from ``swax.ops.list_backends("swa")``, default automatic).
    """

    sliding = True


class FullAttention(_Attention):
    """Causal softmax attention over all previous tokens; RoPE (``rope=True``) or no position
    encoding (``rope=False``). Ignores the ``window`` argument; its decode cache grows."""

    sliding = False
