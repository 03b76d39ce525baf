"""``flash``: flash-attn's ``flash_attn_func`` with ``window_size=(W - 1, 0)`` (CUDA,
float16/bfloat16, ``flash_attn`` installed; imported on first use only)."""

from __future__ import annotations

import torch


def _flash_environment(device: str | None) -> str | None:
    if device != "cuda":
        return "needs CUDA"
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "flash_attn is not installed"
    except Exception as e:  # noqa: BLE001 - a build that does not match the installed torch
        return f"flash_attn does not import ({type(e).__name__}: {e})"
    return None


def _flash_usable(q, k, v, window, doc_ids=None):
    """None when flash-attn takes these inputs (its environment checked before)."""
    if doc_ids is not None:
        return "document masking (doc_ids) is not implemented for it"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"needs float16/bfloat16 inputs, got {q.dtype}"
    return None


def _flash(q, k, v, window, scale, doc_ids=None):
    from flash_attn import flash_attn_func

    ws = (-1, -1) if window is None else (window - 1, 0)
    o = flash_attn_func(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        softmax_scale=scale,
        causal=True,
        window_size=ws,
    )
    return o.transpose(1, 2)
