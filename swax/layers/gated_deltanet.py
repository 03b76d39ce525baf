"""Gated DeltaNet token mixer (layer letter ``D``), after Yang et al. 2024 and fla's layer.

x -> q, k (qk_dim), v (v_dim) -> short causal depthwise convolution + SiLU -> q, k L2-normalised
per head; beta = sigmoid(b_proj(x)); log-decay g = -exp(A_log) · softplus(a_proj(x) + dt_bias);
o = gated_delta_rule(q, k, v, g, beta); y = o_proj(RMSNorm_per_head(o) · silu(g_proj(x))).

Qwen3-Next's layer is this one with three options: ``value_heads`` (grouped value heads: H q/k
heads, Hv value heads, each q/k head serving Hv / H consecutive value heads; beta, the decay and
the state are per value head), ``norm_weight="shared"`` (one output-norm weight of Dv for every
head) and ``l2norm="rsqrt"`` (x · rsqrt(Σx² + 1e-6) instead of x / max(‖x‖, 1e-6)); the defaults
are fla's layer. :mod:`swax.export.qwen3_next` maps a Qwen3NextGatedDeltaNet's weights onto it.

Decode state: (S, conv) with S (B, Hv, Dk, Dv) float32 and conv (B, 2·qk_dim + v_dim, K - 1),
the last K - 1 pre-convolution inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from swax.layers.base import TokenMixer, gate_linear, recurrent_mixing_flops
from swax.layers.norm import MultiHeadNorm
from swax.ops.conv import causal_conv1d
from swax.ops.gated_delta import gated_delta_rule, gated_delta_step
from swax.ops.packing import doc_conv1d


def l2_normalize(x: torch.Tensor, rsqrt: bool) -> torch.Tensor:
    """x over its last dimension divided by its L2 norm, in float32: x / max(‖x‖, 1e-6), or
    with ``rsqrt`` x · rsqrt(Σx² + 1e-6) (fla's and Qwen3-Next's)."""
    x = x.float()
    if rsqrt:
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    return F.normalize(x, dim=-1, eps=1e-6)


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
        value_heads: int | None = None,
        norm_weight: str = "per_head",
        l2norm: str = "clamp",
    ):
        super().__init__()
        qk_dim, v_dim = int(d_model * qk_dim_factor), int(d_model * v_dim_factor)
        vh = value_heads or n_heads
        if qk_dim % n_heads or v_dim % vh or vh % n_heads:
            raise ValueError(
                f"Gated DeltaNet q/k width {qk_dim} must be divisible by n_heads={n_heads}, v "
                f"width {v_dim} by value_heads={vh}, and value_heads by n_heads"
            )
        if conv_size < 1:
            raise ValueError(f"conv_size must be >= 1, got {conv_size}")
        if norm_weight not in ("per_head", "shared") or l2norm not in ("clamp", "rsqrt"):
            raise ValueError(
                f"norm_weight must be per_head or shared and l2norm clamp or rsqrt, got "
                f"{norm_weight!r} and {l2norm!r}"
            )
        self.n_heads, self.v_heads, self.qk_dim, self.v_dim = n_heads, vh, qk_dim, v_dim
        self.conv_size, self.chunk_size = conv_size, chunk_size
        self.rsqrt_l2 = l2norm == "rsqrt"
        self.q_proj = nn.Linear(d_model, qk_dim, bias=False)
        self.k_proj = nn.Linear(d_model, qk_dim, bias=False)
        self.v_proj = nn.Linear(d_model, v_dim, bias=False)
        channels = 2 * qk_dim + v_dim
        self.conv_weight = nn.Parameter(torch.empty(channels, conv_size))
        self.a_proj = nn.Linear(d_model, vh, bias=False)
        self.b_proj = nn.Linear(d_model, vh, bias=False)
        self.A_log = nn.Parameter(torch.empty(vh))
        self.dt_bias = nn.Parameter(torch.empty(vh))
        self.g_proj = nn.Linear(d_model, v_dim, bias=False)
        shared = norm_weight == "shared"
        self.norm = MultiHeadNorm(vh, v_dim // vh, eps=norm_eps, kind="rms", shared=shared)
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
        self.A_log.copy_(torch.empty(self.v_heads).uniform_(1, 16).log())
        dt = torch.exp(
            torch.rand(self.v_heads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)
        ).clamp(min=1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus

    def _grouped(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """q or k with its heads (dimension ``dim``) repeated for the value heads they serve."""
        if self.v_heads == self.n_heads:
            return t
        return t.repeat_interleave(self.v_heads // self.n_heads, dim=dim)

    def _inputs(self, x: torch.Tensor, conv0=None, doc_ids=None):
        """Everything the delta rule reads, from x (B, T, d_model), or (B, d_model) for one
        token per row (then without the T axis): q, k (B, T, Hv, Dk), L2-normalised per head
        (and repeated for grouped value heads), v (B, T, Hv, Dv), the log-decay g and beta
        (B, T, Hv) in float32, the output gate silu(g_proj(x)) (B, T, v_dim) and the
        convolution's new state; ``conv0`` its state before x. The one place the projections,
        the convolution and the gates are computed, for :meth:`sequence` and :meth:`step`
        alike."""
        one = x.ndim == 2
        u = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        u = u[:, :, None] if one else u.transpose(1, 2)  # (B, channels, T)
        if doc_ids is None:
            u, conv = causal_conv1d(u, self.conv_weight, conv0)
        else:
            u, conv = doc_conv1d(u, self.conv_weight, doc_ids)
        u = F.silu(u[:, :, 0] if one else u.transpose(1, 2))
        q, k, v = u.split([self.qk_dim, self.qk_dim, self.v_dim], dim=-1)
        # normalised in float32, returned in the projections' dtype: bfloat16 under autocast,
        # which is what fla's kernel takes (the residual stream x stays float32 there)
        heads = (*x.shape[:-1], self.n_heads, -1)
        q = self._grouped(l2_normalize(q.view(heads), self.rsqrt_l2).to(u.dtype), -2)
        k = self._grouped(l2_normalize(k.view(heads), self.rsqrt_l2).to(u.dtype), -2)
        v = v.reshape(*x.shape[:-1], self.v_heads, -1)
        beta = torch.sigmoid(gate_linear(self.b_proj, x))  # (B, T, Hv), float32
        a = gate_linear(self.a_proj, x)
        g = -self.A_log.float().exp() * F.softplus(a + self.dt_bias.float())
        return q, k, v, g, beta, F.silu(self.g_proj(x)), conv

    def step(self, x: torch.Tensor, buffers: tuple, pos=None) -> torch.Tensor:
        """One decode token per row on fixed-shape buffers: x (B, d_model) -> (B, d_model);
        ``buffers`` (S, conv) as :meth:`sequence` returns the state, updated in place. ``pos``
        is ignored."""
        S, conv = buffers
        q, k, v, g, beta, gate, new_conv = self._inputs(x, conv)
        conv.copy_(new_conv)
        o, S_new = gated_delta_step(q, k, v, g, beta, S)
        S.copy_(S_new)
        return self._out(o, gate)

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
        """y = o_proj(per-head RMSNorm(o) * gate), o (B, [T,] H, Dv), gate (B, [T,] v_dim)."""
        return self.o_proj(self.norm(o) * gate)

    def mixing_flops(self, seq_len: int, window) -> float:
        """State update and readout and the intra-chunk part
        (:func:`~swax.layers.base.recurrent_mixing_flops`)."""
        dk, dv = self.qk_dim / self.n_heads, self.v_dim / self.v_heads
        return recurrent_mixing_flops(self.v_heads, dk, dv, self.chunk_size, seq_len)
