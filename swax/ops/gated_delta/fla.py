"""``fla`` backend of the gated delta rule: flash-linear-attention's Triton
``chunk_gated_delta_rule`` (CUDA, ``flash-linear-attention`` installed, bfloat16/float16
inputs; imported on first use only).

Conventions adapted: fla takes ``(B, T, H, D)`` tensors (we transpose), its own L2-norm is off
(``use_qk_l2norm_in_kernel=False``: the op's q, k are normalised by the caller), ``scale`` is
passed through, ``g`` is the same per-step log-decay, states are ``(B, H, Dk, Dv)`` float32 as
here. ``beta`` is passed in the input dtype (as fla's own layer does) and the kernel's tiles are
in the input dtype, so the two agree to bfloat16 precision, not float32; fla always uses chunks
of 64 (``chunk_size`` is ignored).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from swax.ops.triton_env import device_problem, unusable_install


@lru_cache(maxsize=1)
def _fla_chunk():
    """fla's chunk kernel, or the reason it cannot be imported (imported on first use only)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001 - missing package, triton, or a broken install
        missing = isinstance(e, ModuleNotFoundError) and e.name in ("fla", "triton")
        why = f"flash-linear-attention is not available ({type(e).__name__}: {e})"
        return None, unusable_install("gated_delta 'fla'", why, missing)
    return chunk_gated_delta_rule, None


def _fla_environment(device: str | None) -> str | None:
    return device_problem(device) or _fla_chunk()[1]


def _fla_usable(q, k, v, g, beta, initial_state=None):
    """None when fla's kernel takes these inputs (its environment checked before)."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"fla's chunk kernel needs bfloat16/float16 inputs, got {q.dtype}"
    if q.shape[-1] > 256 or v.shape[-1] > 256:
        return f"fla's chunk kernel needs head dims <= 256, got Dk={q.shape[-1]}, Dv={v.shape[-1]}"
    return None


def _fla(q, k, v, g, beta, initial_state, output_final_state, chunk_size, scale):
    kernel, _ = _fla_chunk()
    dt = q.dtype
    S0 = None if initial_state is None else initial_state.float()
    o, S = kernel(
        q.transpose(1, 2),
        k.to(dt).transpose(1, 2),
        v.to(dt).transpose(1, 2),
        g.float().transpose(1, 2),
        beta.to(dt).transpose(1, 2),
        scale=scale,
        initial_state=S0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=False,
    )
    return o.transpose(1, 2).to(dt), (S.float() if S is not None else S)
