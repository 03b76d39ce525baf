"""The mLSTM cell step by step: the state, the empty state, one recurrent step (decode, and
the ``recurrent`` mode of :func:`swax.ops.mlstm.mlstm`, a loop over time; a reference)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""(C, n, m): (B, H, Dqk, Dv), (B, H, Dqk), (B, H), float32, stabilised (see the package)."""


def _init_state(
    state: State | None, B: int, H: int, Dqk: int, Dv: int, device: torch.device
) -> State:
    """``state`` as float32 (no copy if already float32), or the empty state (C=0, n=0, m=-inf)."""
    if state is None:
        return (
            torch.zeros(B, H, Dqk, Dv, dtype=torch.float32, device=device),
            torch.zeros(B, H, Dqk, dtype=torch.float32, device=device),
            torch.full((B, H), -math.inf, dtype=torch.float32, device=device),
        )
    C, n, m = state
    return C.float(), n.float(), m.float()


def _step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    state: State,
    eps: float,
) -> tuple[torch.Tensor, State]:
    """One recurrent step in float32; ``q`` already scaled. Shapes as in
    :func:`swax.ops.mlstm.mlstm_step`."""
    C, n, m = state
    lf = F.logsigmoid(f)
    m_new = torch.maximum(lf + m, i)
    fa = torch.exp(lf + m - m_new)  # 0 when m = -inf (empty state)
    ia = torch.exp(i - m_new)
    C = fa[..., None, None] * C + ia[..., None, None] * (k[..., :, None] * v[..., None, :])
    n = fa[..., None] * n + ia[..., None] * k
    num = (q[..., None, :] @ C).squeeze(-2)  # (B, H, Dv)
    den = (q * n).sum(-1)
    h = num / (torch.maximum(den.abs(), torch.exp(-m_new)) + eps)[..., None]
    return h, (C, n, m_new)


def recurrent(qf, kf, vf, i_f, f, state: State, eps: float) -> tuple[torch.Tensor, State]:
    """The loop over time, one :func:`_step` per step; ``qf`` already scaled, float32 inputs
    (``f`` is cast here). Returns h (B, H, T, Dv) and the state after the last step."""
    hs = []
    # unbind, not x[:, :, t]: the backward of T selects would cost O(T^2) memory.
    for q_t, k_t, v_t, i_t, f_t in zip(*(x.unbind(2) for x in (qf, kf, vf, i_f, f.float()))):
        h_t, state = _step(q_t, k_t, v_t, i_t, f_t, state, eps)
        hs.append(h_t)
    if hs:
        return torch.stack(hs, 2), state
    B, H, _, Dv = vf.shape
    return vf.new_zeros(B, H, 0, Dv), state
