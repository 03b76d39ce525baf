"""mLSTM token mixer (layer letter ``X``), the xLSTM-7B block mixer.

x -> q, k (qk_dim = qk_dim_factor · d_model), v (v_dim_factor · d_model), output gate o, and one
input and one forget gate pre-activation per head, both soft-capped: cap · tanh(a / cap).
h = mlstm(q, k, v, i, f); y = out_proj(sigmoid(o) * MultiHeadLayerNorm(h)).

``conv_size`` K > 0 adds the short causal convolution of xLSTM's original mLSTM block (and of
Zoology's and fla's recurrent mixers): q and k are computed from SiLU(depthwise causal conv of
x, width K) instead of x; v, the gates and the output gate still read x. Off by default (the
xLSTM-7B cell has none), so models without it are unchanged.

Initialisation follows xLSTM-7B: input-gate bias -10, forget-gate biases spread linearly over
[3, 6] across heads (long memory at the start of training), small gate weights. The input-gate
bias is a parameter: at small widths -10 switches the memory off at initialisation, and
SwaxConfig's smaller presets use a smaller magnitude (see SwaxConfig.mlstm_igate_bias_init).
Decode state: (C, n, m) in float32, shapes (B, H, Dqk, Dv), (B, H, Dqk), (B, H); with the
convolution (C, n, m, conv), conv (B, d_model, K - 1) the last K - 1 inputs of x.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from swax.layers.base import TokenMixer, gate_linear, recurrent_mixing_flops
from swax.layers.norm import MultiHeadNorm
from swax.ops.conv import causal_conv1d
from swax.ops.mlstm import mlstm, mlstm_step
from swax.ops.packing import doc_conv1d


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap · tanh(x / cap); identity when cap is None or <= 0."""
    if cap is None or cap <= 0:
        return x
    return cap * torch.tanh(x / cap)


class MLSTMLayer(TokenMixer):
    """The xLSTM-7B mLSTM mixer. See the module docstring for the computation."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        qk_dim_factor: float = 0.5,
        v_dim_factor: float = 1.0,
        gate_soft_cap: float = 15.0,
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
        igate_bias_init: float = -10.0,
        fgate_bias_init: tuple[float, float] = (3.0, 6.0),
        eps: float = 1e-6,
        conv_size: int = 0,
    ):
        super().__init__()
        if conv_size < 0:
            raise ValueError(f"mLSTM conv_size must be >= 0 (0 = none), got {conv_size}")
        qk_dim, v_dim = int(d_model * qk_dim_factor), int(d_model * v_dim_factor)
        if qk_dim % n_heads or v_dim % n_heads:
            raise ValueError(
                f"mLSTM q/k width {qk_dim} and v width {v_dim} must be divisible by "
                f"n_heads={n_heads}"
            )
        self.n_heads, self.qk_dim, self.v_dim = n_heads, qk_dim, v_dim
        self.gate_soft_cap, self.chunk_size, self.eps = gate_soft_cap, chunk_size, eps
        self.q = nn.Linear(d_model, qk_dim, bias=False)
        self.k = nn.Linear(d_model, qk_dim, bias=False)
        self.v = nn.Linear(d_model, v_dim, bias=False)
        self.ogate = nn.Linear(d_model, v_dim, bias=False)
        self.igate = nn.Linear(d_model, n_heads, bias=True)
        self.fgate = nn.Linear(d_model, n_heads, bias=True)
        self.norm = MultiHeadNorm(n_heads, v_dim // n_heads, eps=norm_eps, kind="layer")
        self.out_proj = nn.Linear(v_dim, d_model, bias=False)
        self.igate_bias_init, self.fgate_bias_init = igate_bias_init, fgate_bias_init
        self.conv_size = conv_size
        self.conv_weight = nn.Parameter(torch.empty(d_model, conv_size)) if conv_size else None
        self.reset_gates()

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        """Normal(0, std) q, k, v and output-gate projections; the output projection, which
        writes to the residual stream, Normal(0, out_std); the head norm's scale at 1; then the
        gates and the convolution (:meth:`reset_gates`)."""
        for proj in (self.q, self.k, self.v, self.ogate):
            nn.init.normal_(proj.weight, std=std)
        nn.init.normal_(self.out_proj.weight, std=out_std)
        self.norm.reset_parameters()
        self.reset_gates()

    @torch.no_grad()
    def reset_gates(self) -> None:
        """xLSTM-7B gate initialisation (called by the constructor and by SwaxLM's init);
        nothing to do on the meta device."""
        if self.igate.weight.is_meta:
            return
        for lin in (self.igate, self.fgate):
            nn.init.normal_(lin.weight, std=0.001)
        self.igate.bias.fill_(self.igate_bias_init)
        lo, hi = self.fgate_bias_init
        self.fgate.bias.copy_(torch.linspace(lo, hi, self.n_heads))
        if self.conv_weight is not None:  # as Gated DeltaNet's (fla / Mamba-2)
            bound = 1 / math.sqrt(self.conv_size)
            nn.init.uniform_(self.conv_weight, -bound, bound)

    def _inputs(self, x: torch.Tensor, conv0=None, doc_ids=None):
        """Everything the cell reads, from x (B, T, d_model), or (B, d_model) for one token per
        row (then without the T axis): q, k (B, T, H, Dqk), v (B, T, H, Dv), the soft-capped
        gate pre-activations i, f (B, T, H), the output gate o (B, T, v_dim) and, with the
        convolution, its new state (else None); ``conv0``: the convolution's state before x.
        The one place the projections, the convolution and the gates are computed, for
        :meth:`sequence` and :meth:`step` alike."""
        xqk, conv = x, None
        if self.conv_weight is not None:
            u = x[:, :, None] if x.ndim == 2 else x.transpose(1, 2)  # (B, d, T)
            if doc_ids is None:
                u, conv = causal_conv1d(u, self.conv_weight, conv0)
            else:
                u, conv = doc_conv1d(u, self.conv_weight, doc_ids)
            xqk = F.silu(u[:, :, 0] if x.ndim == 2 else u.transpose(1, 2))
        heads = (*x.shape[:-1], self.n_heads, -1)
        q = self.q(xqk).view(heads)
        k = self.k(xqk).view(heads)
        v = self.v(x).view(heads)
        i = soft_cap(gate_linear(self.igate, x), self.gate_soft_cap)  # float32 (gate_linear)
        f = soft_cap(gate_linear(self.fgate, x), self.gate_soft_cap)
        return q, k, v, i, f, torch.sigmoid(self.ogate(x)), conv

    def _out(self, o: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """y = out_proj(o * head-norm(h))."""
        return self.out_proj(o * self.norm(h))

    def step(self, x: torch.Tensor, buffers: tuple, pos=None) -> torch.Tensor:
        """One decode token per row on fixed-shape buffers: x (B, d_model) -> (B, d_model);
        ``buffers`` (C, n, m) or (C, n, m, conv) as :meth:`sequence` returns the state, updated
        in place. ``pos`` is ignored."""
        conv0 = buffers[3] if self.conv_weight is not None else None
        q, k, v, i, f, o, conv = self._inputs(x, conv0)
        if conv is not None:
            buffers[3].copy_(conv)
        h, new = mlstm_step(q, k, v, i, f, buffers[:3], eps=self.eps)
        for buf, value in zip(buffers, new):
            buf.copy_(value)
        return self._out(o, h)

    def sequence(self, x: torch.Tensor, window, state, return_state: bool, doc_ids):
        """x: (B, T, d_model) -> (y (B, T, d_model), (C, n, m) or (C, n, m, conv) or None).
        ``window`` is ignored; with ``doc_ids`` state and convolution restart at each
        document."""
        conv0 = state[3] if state is not None and self.conv_weight is not None else None
        q, k, v, i, f, o, conv = self._inputs(x, conv0, doc_ids)
        h, new_state = mlstm(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            i.transpose(1, 2),
            f.transpose(1, 2),
            initial_state=None if state is None else state[:3],
            output_final_state=return_state,
            mode="chunk",
            chunk_size=self.chunk_size,
            eps=self.eps,
            doc_ids=doc_ids,
        )
        y = self._out(o, h.transpose(1, 2))  # h: (B, T, H, Dv)
        if return_state and conv is not None:
            new_state = (*new_state, conv)
        return y, new_state

    def mixing_flops(self, seq_len: int, window) -> float:
        """State update and readout (4·Dqk·Dv per head) and the intra-chunk part (about
        2·(Dqk + Dv)·chunk per head)."""
        return recurrent_mixing_flops(
            self.n_heads, self.qk_dim, self.v_dim, self.chunk_size, seq_len
        )
