"""The gated delta rule step by step: one recurrent step (decode, ``gated_delta_step``) and
the loop over time (``mode="recurrent"`` of :func:`swax.ops.gated_delta.gated_delta_rule`, the
reference). The math is in the package docstring."""

from __future__ import annotations

import torch


def _recurrent_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    beta_t: torch.Tensor,
    S: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step in compute dtype. q_t, k_t: (B,H,Dk) (q_t scaled); v_t: (B,H,Dv);
    g_t, beta_t: (B,H); S: (B,H,Dk,Dv). Returns (o_t (B,H,Dv), new S). Out of place."""
    S = S * torch.exp(g_t)[..., None, None]
    kS = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # S^T k_t: (B, H, Dv)
    u = (v_t - kS) * beta_t.unsqueeze(-1)
    S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)
    o_t = (q_t.unsqueeze(-2) @ S).squeeze(-2)
    return o_t, S


def _recurrent(q, k, v, g, beta, S):
    T = q.shape[2]
    outs = []
    for t in range(T):
        o_t, S = _recurrent_step(q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t], S)
        outs.append(o_t)
    if outs:
        o = torch.stack(outs, dim=2)
    else:
        o = q.new_zeros(*q.shape[:3], v.shape[-1])
    return o, S
