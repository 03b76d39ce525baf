"""Gated DeltaNet token mixer (layer letter ``D``), after Yang et al. 2024 and fla's layer.

x -> q, k (qk_dim), v (v_dim) -> short causal depthwise convolution + SiLU -> q, k L2-normalised
per head; beta = sigmoid(b_proj(x)); log-decay g = -exp(A_log) · softplus(a_proj(x) + dt_bias);
o = gated_delta_rule(q, k, v, g, beta); y = o_proj(RMSNorm_per_head(o) · silu(g_proj(x))).

Decode state: (S, conv) with S (B, H, Dk, Dv) float32 and conv (B, 2·qk_dim + v_dim, K - 1),
the last K - 1 pre-convolution inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from swax.layers.base import TokenMixer, recurrent_mixing_flops
from swax.layers.norm import MultiHeadNorm
from swax.ops.conv import causal_conv1d
from swax.ops.gated_delta import gated_delta_rule, gated_delta_step
from swax.ops.packing import doc_conv1d


class GatedDeltaNetLayer(TokenMixer):
    """Gated DeltaNet mixer. See the module docstring for the computation."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        qk_dim_factor: float = 0.5,
        v_dim_factor: float = 1.0,
        conv_size: int = 4,
        chunk_size: int = 64,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        qk_dim, v_dim = int(d_model * qk_dim_factor), int(d_model * v_dim_factor)
        if qk_dim % n_heads or v_dim % n_heads:
            raise ValueError(
                f"Gated DeltaNet q/k width {qk_dim} and v width {v_dim} must be divisible by "
                f"n_heads={n_heads}"
            )
        if conv_size < 1:
            raise ValueError(f"conv_size must be >= 1, got {conv_size}")
        self.n_heads, self.qk_dim, self.v_dim = n_heads, qk_dim, v_dim
        self.conv_size, self.chunk_size = conv_size, chunk_size
        self.q_proj = nn.Linear(d_model, qk_dim, bias=False)
        self.k_proj = nn.Linear(d_model, qk_dim, bias=False)
        self.v_proj = nn.Linear(d_model, v_dim, bias=False)
        channels = 2 * qk_dim + v_dim
        self.conv_weight = nn.Parameter(torch.empty(channels, conv_size))
        self.a_proj = nn.Linear(d_model, n_heads, bias=False)
        self.b_proj = nn.Linear(d_model, n_heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(n_heads))
        self.dt_bias = nn.Parameter(torch.empty(n_heads))
        self.g_proj = nn.Linear(d_model, v_dim, bias=False)
        self.norm = MultiHeadNorm(n_heads, v_dim // n_heads, eps=norm_eps, kind="rms")
        self.o_proj = nn.Linear(v_dim, d_model, bias=False)
        self.reset_special()

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        """Normal(0, std) projections; the output projection, which writes to the residual
        stream, Normal(0, out_std); the output norm's scale at 1; then :meth:`reset_special`."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.a_proj, self.b_proj):
            nn.init.normal_(proj.weight, std=std)
        nn.init.normal_(self.g_proj.weight, std=std)
        nn.init.normal_(self.o_proj.weight, std=out_std)
        self.norm.reset_parameters()
        self.reset_special()

    @torch.no_grad()
    def reset_special(self) -> None:
        """fla/Mamba-2 initialisation of the convolution, decay rate A and time-step bias."""
        nn.init.uniform_(
            self.conv_weight, -1 / math.sqrt(self.conv_size), 1 / math.sqrt(self.conv_size)
        )
        self.A_log.copy_(torch.empty(self.n_heads).uniform_(1, 16).log())
        dt = torch.exp(
            torch.rand(self.n_heads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)
        ).clamp(min=1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus

    def _inputs(self, x: torch.Tensor, conv0=None, doc_ids=None):
        """Everything the delta rule reads, from x (B, T, d_model): q, k (B, T, H, Dk),
        L2-normalised per head, v (B, T, H, Dv), the log-decay g and beta (B, T, H) in float32,
        the output gate silu(g_proj(x)) (B, T, v_dim) and the convolution's new state; ``conv0``
        its state before x. The one place the projections, the convolution and the gates are
        computed, for :meth:`sequence` and :meth:`step` alike."""
        B, T, _ = x.shape
        H = self.n_heads
        u = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1).transpose(1, 2)
        if doc_ids is None:
            u, conv = causal_conv1d(u, self.conv_weight, conv0)
        else:
            u, conv = doc_conv1d(u, self.conv_weight, doc_ids)
        u = F.silu(u)
        q, k, v = u.transpose(1, 2).split([self.qk_dim, self.qk_dim, self.v_dim], dim=-1)
        # normalised in float32, returned in the projections' dtype: bfloat16 under autocast,
        # which is what fla's kernel takes (the residual stream x stays float32 there)
        q = F.normalize(q.float().view(B, T, H, -1), dim=-1, eps=1e-6).to(u.dtype)
        k = F.normalize(k.float().view(B, T, H, -1), dim=-1, eps=1e-6).to(u.dtype)
        v = v.reshape(B, T, H, -1)
        beta = torch.sigmoid(self.b_proj(x).float())
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias.float())
        return q, k, v, g, beta, F.silu(self.g_proj(x)), conv

    def step(self, x: torch.Tensor, buffers: tuple, pos=None) -> torch.Tensor:
        """One decode token per row on fixed-shape buffers: x (B, d_model) -> (B, d_model);
        ``buffers`` (S, conv) as :meth:`sequence` returns the state, updated in place. ``pos``
        is ignored."""
        S, conv = buffers
        q, k, v, g, beta, gate, new_conv = self._inputs(x[:, None], conv)
        conv.copy_(new_conv)
        o, S_new = gated_delta_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], S)
        S.copy_(S_new)
        return self._out(o[:, None], gate)[:, 0]

    def sequence(self, x: torch.Tensor, window, state, return_state: bool, doc_ids):
        """x: (B, T, d_model) -> (y (B, T, d_model), (S, conv) or None). ``window`` is ignored;
        with ``doc_ids`` state and convolution restart at each document."""
        S0, conv0 = (None, None) if state is None else state
        q, k, v, g, beta, gate, new_conv = self._inputs(x, conv0, doc_ids)
        o, S = gated_delta_rule(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            g.transpose(1, 2),
            beta.transpose(1, 2),
            initial_state=S0,
            output_final_state=return_state,
            mode="chunk",
            chunk_size=self.chunk_size,
            doc_ids=doc_ids,
        )
        y = self._out(o.transpose(1, 2), gate)  # o: (B, T, H, Dv)
        return y, ((S, new_conv) if return_state else None)

    def _out(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """y = o_proj(per-head RMSNorm(o) * gate), o (B, T, H, Dv), gate (B, T, v_dim)."""
        return self.o_proj(self.norm(o) * gate)

    def mixing_flops(self, seq_len: int, window) -> float:
        """State update and readout and the intra-chunk part
        (:func:`~swax.layers.base.recurrent_mixing_flops`)."""
        return recurrent_mixing_flops(self.n_heads, self.qk_dim, self.v_dim, self.chunk_size,
                                      seq_len)  # fmt: skip
