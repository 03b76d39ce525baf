"""``reference``: naive masked softmax over the full Tq×Tk score matrix — a readable reference
for small inputs only (any device, gradients through autograd)."""

from __future__ import annotations

import torch


def _reference(q, k, v, window, scale, doc_ids=None):
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    kf = k.float().repeat_interleave(G, dim=1)
    vf = v.float().repeat_interleave(G, dim=1)
    s = (q.float() @ kf.transpose(-1, -2)) * scale
    qpos = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
    kpos = torch.arange(Tk, device=q.device)[None, :]
    mask = kpos <= qpos
    if window is not None:
        mask = mask & (qpos - kpos < window)
    if doc_ids is not None:  # (B, 1, Tq, Tk): same document only
        mask = mask & (doc_ids[:, None, :, None] == doc_ids[:, None, None, :])
    s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ vf).to(q.dtype)
