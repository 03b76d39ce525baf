"""mlstm's ``triton`` backend: an adapter to mlstm_kernels' ``chunkwise--triton_xl_chunk``
kernel (see :mod:`swax.ops.mlstm` for what it computes and how its conventions and its
gradient are adapted).

mlstm_kernels and triton are optional: they are imported on first use only, and
:func:`triton_usable` says why the backend cannot run when they are missing.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from swax.ops.triton_env import device_problem, triton_problem, unusable_install


def _triton_prefix(T: int) -> int:
    """Longest prefix mlstm_kernels' xl_chunk kernel accepts: a multiple of 128 steps, else
    16, 32 or 64."""
    if T >= 128:
        return T // 128 * 128
    return next((p for p in (64, 32, 16) if p <= T), 0)


@lru_cache(maxsize=1)
def _triton_forward_stats():
    """mlstm_kernels' forward function (not part of its public API), which also returns each
    step's denominator ``max(|nᵀq̃|, exp(-m'))`` and stabiliser m'; None if it cannot be
    imported (the gradient correction then reads them less exactly, see
    :func:`_triton_with_true_grad`)."""
    try:
        from mlstm_kernels.torch.chunkwise.triton_xl_chunk.fw import mlstm_chunkwise_fw

        return mlstm_chunkwise_fw
    except Exception:  # noqa: BLE001 - absent or moved in another mlstm_kernels version
        return None


@lru_cache(maxsize=1)
def _triton_kernel():
    """mlstm_kernels' Triton chunkwise kernel, or the reason it is unavailable (imported on
    first use only)."""
    try:
        from mlstm_kernels.torch import get_mlstm_kernel

        kernel = get_mlstm_kernel("chunkwise--triton_xl_chunk")
    except Exception as e:  # noqa: BLE001 - not installed, no triton, or a broken install
        missing = isinstance(e, ModuleNotFoundError) and e.name in ("mlstm_kernels", "triton")
        why = f"mlstm_kernels' triton_xl_chunk is not available ({type(e).__name__}: {e})"
        return None, unusable_install("mlstm 'triton'", why, missing)
    problem = triton_problem()
    if problem is not None:
        return None, unusable_install("mlstm 'triton'", problem)
    return kernel, None


def triton_environment(device: str | None) -> str | None:
    """None when the installed packages and the device type let the backend run at all."""
    return device_problem(device) or _triton_kernel()[1]


def triton_usable(q, k, v, i, f, initial_state=None, output_final_state=False):
    """None when the backend can run on these inputs (its environment checked before, by the
    registry), else why it cannot."""
    Dqk, Dv = q.shape[-1], v.shape[-1]
    if Dqk % 16 or Dv % 16:
        return f"needs head dims that are multiples of 16, got Dqk={Dqk}, Dv={Dv}"
    if _triton_prefix(q.shape[2]) == 0:
        return f"sequence of {q.shape[2]} < 16 steps"
    if torch.is_grad_enabled():
        st = initial_state if initial_state is not None else ()
        if any(isinstance(x, torch.Tensor) and x.requires_grad for x in st):
            return "the Triton kernel does not backpropagate into an initial state's n and m"
        if output_final_state and any(x.requires_grad for x in (q, k, v, i, f)):
            return "the Triton kernel does not backpropagate from the final state's n and m"
    return None


def _final_m(i, f, m_init):
    """The cell's m after the last step, from the gates alone (float64 scan, O(T))."""
    F_ = F.logsigmoid(f.float()).double().cumsum(-1)  # (B, H, T)
    w = i.double() - F_
    return (F_[..., -1] + torch.maximum(m_init.double(), w.amax(-1))).float()


_KERNEL_M_FLOOR = -10.0  # mlstm_kernels' MINIMUM_MAX_VAL: the kernel's m' is never below it


def _kernel_m(i, f, m0):
    """The Triton kernel's stabiliser at every step, differentiable in i and f:
    ``m'_t = max(m0 + F_t, max_{j<=t} F_t - F_j + i_j, -10)`` with ``F_t = Σ_{s<=t} log f_s``
    (float64; m0 = 0 for the empty state, the kernel's convention; -10 is the kernel's floor)."""
    F_ = F.logsigmoid(f.double()).cumsum(-1)  # (B, H, T)
    best = torch.cummax(i.double() - F_, dim=-1).values
    return (F_ + torch.maximum(best, m0.double()[..., None])).clamp_min(_KERNEL_M_FLOOR)


_AUG = 16  # extra value columns: ones, then zeros up to a multiple of 16


def _on_n_tolerance(device: torch.device) -> float:
    """How far from 1 ``|r| = |n·q̃| / |n·q̃|`` may be on the ``|n·q̃|`` branch: the kernel
    accumulates the ones column through ``tl.dot`` (TF32 for float32 tiles on CUDA, about
    2^-11 per term) and the normaliser in float32, so on CUDA a few bf16 units; in float32
    arithmetic (Triton's interpreter, the tests' stand-in) up to ~1000 float32 units, for
    sums that cancel. A step whose |n·q̃| lies within about this relative distance of exp(-m)
    may get the gradient of the other side of the kink."""
    return 2.0**-8 if device.type == "cuda" else 2.0**-14


def _triton_padded_len(T: int) -> int:
    """Length the kernel runs at when no final state is needed: a multiple of 128 steps, or
    16, 32 or 64 for short sequences (padding at the end cannot reach earlier outputs)."""
    if T > 64:
        return -(-T // 128) * 128
    return next(p for p in (16, 32, 64) if p >= T)


def _ones_columns(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, H, T, _AUG) value columns: ones, then zeros (the kernel wants multiples of 16)."""
    out = torch.zeros(*like.shape[:3], _AUG, device=like.device, dtype=dtype)
    out[..., 0] = 1
    return out


def _triton_with_true_grad(kern, q, k, v, i, f, state, m_in, eps, stats=None):
    """The kernel's h with the gradient of the function it computes.

    mlstm_kernels' backward equals the gradient with the denominator
    ``den = max(|nᵀq̃|, exp(-m')) + eps`` and the stabiliser m' held constant (checked against
    a parallel reference; benchmarks/mlstm_triton_grad.py), so it misses two terms, restored here:

    - through ``nᵀq̃``, where that branch of the max is active: ``∂L/∂(nᵀq̃) =
      -sign(nᵀq̃) Σ_v ∂L/∂h_v · h_v / den``. The kernel computes ``r = nᵀq̃ / den`` itself, with
      its gradient at constant den and m', from one extra value column of ones (the extra
      column of an initial state's C is its n: that is what the column accumulates); so
      ``∂L/∂r = -sign(r) Σ_v ∂L/∂h_v · h_v`` there. Which branch is active is read from a
      second, gradient-free forward on the same tiles: with ``stats`` (mlstm_kernels' forward
      function) from the kernel's own ``max(|nᵀq̃|, exp(-m'))`` and m' at each step, exactly;
      without it, from a call with ``eps = 0`` and only the ones column, where the ``|nᵀq̃|``
      branch gives ``|r| = 1`` up to :func:`_on_n_tolerance` (with eps > 0, |r| and the
      threshold ``1 / (1 + eps·exp(m'))`` agree only to within float32 rounding at the kink).
    - through m' (both branches): ``∂L/∂m' = -(eps/den) Σ_v ∂L/∂h_v · h_v``: from ``stats``
      exactly, else ``1 - |r|`` on the ``|nᵀq̃|`` side and ``1 - τ``, ``τ = 1/(1 + eps·exp(m'))``,
      on the other (at most ``1 - τ`` on both); m' is recomputed from the gates, differentiably.

    Both terms enter as zeros whose gradients are these, so h's value is the kernel's. The
    sequence is padded at the end to a length the kernel accepts (outputs are causal).
    """
    T = q.shape[2]
    P = _triton_padded_len(T)
    low = q.dtype in (torch.bfloat16, torch.float16)
    dt = q.dtype if low else torch.float32
    gates = [F.pad(x.float(), (0, P - T)) for x in (i, f)]
    h, r = _augmented_call(kern, q, k, v, gates, state, m_in, eps, P, dt)
    m_k = _kernel_m(i, f, m_in).float()
    with torch.no_grad():
        tau = torch.sigmoid(-(m_k + math.log(eps))) if eps > 0 else torch.ones_like(m_k)
        if stats is not None:  # the kernel's own denominator and m' at every step
            on_n, eps_over_den = _side_from_stats(stats, q, k, v, gates, state[1], m_in, eps, dt)
        else:
            on_n = _side_from_ones_call(kern, q, k, v, gates, state[1], m_in)
            eps_over_den = torch.where(on_n, (1 - r.abs()).clamp(0, None), 1 - tau)
        eps_over_den = torch.minimum(eps_over_den, 1 - tau)
        sign = torch.where(on_n, torch.sign(r), torch.zeros_like(r))
        h_c = h.detach()
    dr = sign * (r - r.detach())
    dm = eps_over_den * (m_k - m_k.detach())
    return h - h_c * (dr + dm)[..., None]


def _pad_time(x: torch.Tensor, P: int) -> torch.Tensor:
    """(B, H, T, D) padded with zeros at the end to P steps."""
    return F.pad(x, (0, 0, 0, P - x.shape[2]))


def _ones_state(n: torch.Tensor) -> torch.Tensor:
    """The initial C of the _AUG extra value columns: n for the ones column, then zeros."""
    return torch.cat([n[..., None], n.new_zeros(*n.shape, _AUG - 1)], -1)


def _augmented_call(kern, q, k, v, gates, state, m_in, eps, P, dt):
    """(h, r): the kernel's h and ``r = nᵀq̃ / den``, with their (constant den and m')
    gradients, from one call with the ones columns appended to v (padded to P steps)."""
    T, Dv = v.shape[2], v.shape[3]
    C, n, _ = state
    vs = torch.cat([v.to(dt), _ones_columns(v, dt)], -1)
    h_aug = kern(
        *(_pad_time(x.to(dt), P) for x in (q, k, vs)),
        *gates,
        c_initial=torch.cat([C, _ones_state(n)], -1),
        eps=eps,
        n_initial=n,
        m_initial=m_in[..., None],
        chunk_size=min(P, 128),
    )
    h_aug = (h_aug[0] if isinstance(h_aug, tuple) else h_aug)[:, :, :T].float()
    return h_aug[..., :Dv], h_aug[..., Dv]


def _side_from_stats(stats, q, k, v, gates, n, m_in, eps, dt):
    """(on the ``|nᵀq̃|`` side of the max at each step, eps / den) from mlstm_kernels' forward
    function, which returns the kernel's own denominator and m' at every step."""
    T, P = q.shape[2], gates[0].shape[-1]
    # under CUDA autocast the kernel's autograd function casts its inputs to float32
    # (mlstm_kernels' custom_fwd): read the statistics from the same tiles
    sdt = torch.float32 if torch.is_autocast_enabled(q.device.type) else dt
    _, den, m_out = stats(
        matQ=_pad_time(q.detach().to(sdt), P),
        matK=_pad_time(k.detach().to(sdt), P),
        matV=_pad_time(_ones_columns(v, sdt), P),
        vecI=gates[0].detach(),
        vecF=gates[1].detach(),
        matC_initial=_ones_state(n),
        vecN_initial=n,
        scaM_initial=m_in[..., None],
        chunk_size=min(P, 128),
        output_dtype=torch.float32,
        eps=0.0,
    )[:3]
    den, m_out = den[:, :, :T].float(), m_out[:, :, :T].float()
    on_n = den > torch.exp(-m_out) * (1 + 2.0**-20)
    return on_n, eps / (den + eps)


def _side_from_ones_call(kern, q, k, v, gates, n, m_in):
    """Whether each step is on the ``|nᵀq̃|`` side of the max, from an ``eps = 0`` call on the
    ones column alone (there ``|r| = 1`` up to :func:`_on_n_tolerance`)."""
    T, P = q.shape[2], gates[0].shape[-1]
    r0 = kern(
        *(_pad_time(x.detach().float(), P) for x in (q, k)),
        _pad_time(_ones_columns(v, torch.float32), P),
        *(g.detach() for g in gates),
        c_initial=_ones_state(n),
        eps=0.0,
        n_initial=n,
        m_initial=m_in[..., None],
        chunk_size=min(P, 128),
    )
    r0 = (r0[0] if isinstance(r0, tuple) else r0)[:, :, :T, 0].float()
    return r0.abs() >= 1 - _on_n_tolerance(q.device)


def _grad_needed(*xs) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def triton_backend(q, k, v, i, f, state, chunk_size, eps, rest):
    """mlstm's ``triton`` backend: the kernel on the longest prefix it accepts (with the true
    gradient where gradients are needed, padded instead), ``rest`` (a backend of the same
    signature, swax's native kernel) on the remaining steps from the prefix's final state."""
    kern = _triton_kernel()[0]
    C, n, m = state
    # the empty state is C = n = 0, m = -inf here; the kernel's own convention is m = 0
    m_in = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    if _grad_needed(q, k, v, i, f):
        # no final state is wanted with gradients, and the initial one carries none (both
        # ensured by triton_usable): there is no final state to return
        stats = _triton_forward_stats()
        return _triton_with_true_grad(kern, q, k, v, i, f, state, m_in, eps, stats), None
    T = q.shape[2]
    P = _triton_prefix(T)
    low = q.dtype in (torch.bfloat16, torch.float16)
    dt = q.dtype if low else torch.float32
    h, (C1, n1, m1) = kern(
        q[:, :, :P].to(dt),
        k[:, :, :P].to(dt),
        v[:, :, :P].to(dt),
        i[:, :, :P].float(),
        f[:, :, :P].float(),
        c_initial=C,
        n_initial=n,
        m_initial=m_in[..., None],
        return_last_states=True,
        eps=eps,
        chunk_size=128 if P >= 128 else P,
    )
    m1 = m1.float().reshape(m.shape)
    m_true = _final_m(i[:, :, :P], f[:, :, :P], m)
    scale = torch.exp(m1 - m_true)  # >= 1: the kernel's m can only be larger
    state = (
        C1.float() * scale[..., None, None],
        n1.float().reshape(n.shape) * scale[..., None],
        m_true,
    )
    if P == T:
        return h, state
    h2, state = rest(
        q[:, :, P:], k[:, :, P:], v[:, :, P:], i[:, :, P:], f[:, :, P:], state, chunk_size, eps
    )
    return torch.cat([h.to(h2.dtype), h2], 2), state
