"""Helpers shared by the op tests: one error metric, the naive references, input factories.

**Error metric.** :func:`rel_err` is normwise: ``max|actual - expected| / max(max|expected|,
floor)``, the error relative to the size of the whole output (elementwise relative errors are
meaningless where an output crosses zero). :func:`assert_close` checks it against a tolerance.

**References** (written here from the formulas, nothing from swax): :func:`naive_mlstm`,
:func:`naive_gated_delta` (fla's ``naive_recurrent_gated_delta_rule``) and :func:`naive_swa`,
each a plain loop that runs in the dtype it is given (float64: the reference; float32: what a
straightforward float32 implementation makes of the same inputs).

**Tolerances come from the precision.** A float32 op is compared with the float64 reference
and may be at most :data:`NOISE_FACTOR` times worse than float32's own noise on those inputs,
measured by :func:`noise_floor` (the plain float32 loop, and the float64 loop on inputs
perturbed by one float32 rounding); a fixed constant would fit one CPU's float32 kernels only
(AVX-512, AVX2 and ``ATEN_CPU_CAPABILITY=default`` round differently). Results rounded to
bfloat16 are bounded by a small multiple of its unit roundoff (:func:`unit_roundoff`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

# ------------------------------------------------------------------------------ device

DEV = "cuda" if torch.cuda.is_available() else "cpu"
"""Where the gpu tier runs: CUDA, else the CPU (under Triton's interpreter, see
tests/triton_interp.py; without it the tier is skipped)."""

# ------------------------------------------------------------------------------ precision


def unit_roundoff(dtype: torch.dtype) -> float:
    """Largest relative error of rounding to ``dtype``: 2^-53, 2^-24, 2^-8 (bfloat16)."""
    return torch.finfo(dtype).eps / 2


U32 = unit_roundoff(torch.float32)
U16 = unit_roundoff(torch.bfloat16)
UTF32 = 2.0**-11
"""TF32 (10 explicit mantissa bits): what Triton's ``tl.dot`` does with float32 tiles on CUDA
unless told otherwise (mlstm_kernels, fla), and cuBLAS when TF32 is allowed."""

NOISE_FACTOR = 8
"""An op may be at most this many times worse than float32's own noise floor on the same inputs
(a chunkwise or blocked kernel rounds in other places and more often than the plain loop; a real
defect gives errors of order 1)."""

FLOOR = 16 * U32
"""Absolute normwise floor for outputs a loop happens to compute exactly (e.g. mLSTM's m)."""


# ------------------------------------------------------------------------------ one metric


def rel_err(actual: torch.Tensor, expected: torch.Tensor, floor: float = 0.0) -> float:
    """max|actual - expected| / max(max|expected|, floor); 0 for empty tensors."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert a.shape == e.shape, (tuple(a.shape), tuple(e.shape))
    assert torch.isfinite(a).all(), "non-finite values"
    if not e.numel():
        return 0.0
    return ((a - e).abs().max() / e.abs().max().clamp_min(max(floor, 1e-30))).item()


def assert_close(actual, expected, tol: float, what: str = "", floor: float = 0.0) -> None:
    """rel_err(actual, expected, floor) <= tol, with a message naming ``what``."""
    err = rel_err(actual, expected, floor)
    assert err <= tol, f"{what}: normwise error {err:.3e} > tolerance {tol:.3e}"


def _units(unit, n: int) -> list[float]:
    """One perturbation size per input: ``unit`` itself, or one per input (a sequence)."""
    units = [unit] * n if isinstance(unit, (int, float)) else list(unit)
    assert len(units) == n, (len(units), n)
    return units


def noise_floor(
    reference: Callable[..., Sequence[torch.Tensor]],
    inputs: Sequence[torch.Tensor],
    draws: int = 3,
    seed: int = 0,
    unit: float | Sequence[float] = U32,
) -> tuple[list[float], list[torch.Tensor]]:
    """(floor of each output, float64 outputs) of ``reference(*inputs, dtype=...)``: the
    normwise error that float32 rounding alone causes on these inputs, the larger of (a) the
    reference run in float32 and (b) the float64 reference on inputs perturbed by one float32
    rounding (relative 2^-24, ``draws`` times). Ill-conditioned inputs raise the floor; a test
    bounds an op's error by :data:`NOISE_FACTOR` times it instead of a machine's constant.
    ``unit`` (default float32's) sets the size of the perturbation: ``UTF32`` or ``U16`` for
    ops whose kernels round to TF32 or bfloat16 inside; a sequence gives one per input (e.g.
    bfloat16 tiles for q, k, v and float32 gates)."""
    refs = list(reference(*inputs, dtype=torch.float64))
    runs = [list(reference(*inputs, dtype=torch.float32))]
    g = torch.Generator().manual_seed(seed)
    units = _units(unit, len(inputs))
    for _ in range(draws):
        pert = [
            x.double() * (1 + u * (2 * torch.rand(x.shape, generator=g, dtype=torch.float64) - 1))
            for x, u in zip(inputs, units)
        ]
        runs.append(list(reference(*pert, dtype=torch.float64)))
    return [max(rel_err(r[j], refs[j]) for r in runs) for j in range(len(refs))], refs


def assert_within_noise(outputs, floors, refs, names, factor: float = NOISE_FACTOR) -> None:
    """Each output within ``factor`` x its float32 noise floor (+ FLOOR) of the reference
    (``factor=2 * NOISE_FACTOR`` for the difference of two float32 results that are each
    within NOISE_FACTOR of it)."""
    for a, floor, e, name in zip(outputs, floors, refs, names):
        err, bound = rel_err(a, e), factor * floor + FLOOR
        assert err <= bound, (
            f"{name}: normwise error {err:.3e} > {factor} x float32 noise floor "
            f"{floor:.3e} (+{FLOOR:.1e})"
        )


# ------------------------------------------------------------------------------ references


def naive_mlstm(q, k, v, i, f, state=None, eps=1e-6, dtype=torch.float64):
    """The mLSTM cell, a loop over time straight from its equations (docs/design.md, "The ops'
    conventions"), in ``dtype``. Returns h, (C, n, m)."""
    q, k, v, i, f = (x.to(dtype) for x in (q, k, v, i, f))
    B, H, T, Dqk = q.shape
    Dv = v.shape[-1]
    if state is None:
        C = q.new_zeros(B, H, Dqk, Dv)
        n = q.new_zeros(B, H, Dqk)
        m = q.new_full((B, H), -math.inf)
    else:
        C, n, m = (x.to(dtype) for x in state)
    hs = []
    for t in range(T):
        logf = F.logsigmoid(f[:, :, t])
        m_new = torch.maximum(logf + m, i[:, :, t])  # the stabiliser
        fp = torch.exp(logf + m - m_new)
        ip = torch.exp(i[:, :, t] - m_new)
        kt, vt = k[:, :, t], v[:, :, t]
        C = fp[..., None, None] * C + ip[..., None, None] * (kt[..., :, None] * vt[..., None, :])
        n = fp[..., None] * n + ip[..., None] * kt
        m = m_new
        qt = q[:, :, t] * Dqk**-0.5
        num = (qt[..., :, None] * C).sum(-2)
        den = torch.maximum((n * qt).sum(-1).abs(), torch.exp(-m)) + eps
        hs.append(num / den[..., None])
    h = torch.stack(hs, 2) if hs else q.new_zeros(B, H, 0, Dv)
    return h, (C, n, m)


def naive_gated_delta(q, k, v, g, beta, initial_state=None, scale=None, dtype=torch.float64):
    """fla's naive_recurrent_gated_delta_rule in (B, H, T, D) layout, in ``dtype``:
    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - S_{t-1}' k_t))ᵀ, o_t = S_tᵀ (scale q_t)."""
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    b, h, T, dk = q.shape
    dv = v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    S = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(dtype)
    q = q * scale
    o = []
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None, None]
        b_v = (v[:, :, t] - (S * k[:, :, t][..., None]).sum(-2)) * beta[:, :, t][..., None]
        S = S + k[:, :, t].unsqueeze(-1) * b_v.unsqueeze(-2)
        o.append(torch.einsum("bhd,bhdm->bhm", q[:, :, t], S))
    o = torch.stack(o, dim=2) if o else q.new_zeros(b, h, 0, dv)
    return o, S


def naive_swa(q, k, v, window, scale=None, dtype=torch.float64):
    """Sliding-window attention by an explicit softmax per query over its allowed keys (the
    last ``window`` keys up to its own position; queries align to the end of the keys), in
    ``dtype``; grouped-query heads read key/value head h // (Hq / Hkv)."""
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = D**-0.5 if scale is None else scale
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    out = []
    for t in range(Tq):
        p = t + Tk - Tq  # absolute position of query t
        lo = 0 if window is None else max(0, p - window + 1)
        s = (k[:, :, lo : p + 1] @ q[:, :, t, :, None])[..., 0] * scale  # (B, Hq, n)
        out.append((s.softmax(-1)[..., None] * v[:, :, lo : p + 1]).sum(2))
    return torch.stack(out, 2)


def grads(fn: Callable, inputs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor]):
    """(outputs, gradients w.r.t. ``inputs``) of the loss sum_j (weights_j · outputs_j) in
    float64; ``fn(*inputs)`` returns the outputs as a flat sequence. Inputs are not changed."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    outs = list(fn(*leaves))
    loss = sum((o.double() * w).sum() for o, w in zip(outs, weights))
    return [o.detach() for o in outs], list(torch.autograd.grad(loss, leaves))


# ------------------------------------------------------------------------------ inputs


def mlstm_inputs(T, B=2, H=2, Dqk=16, Dv=32, seed=0, dtype=torch.float32, i_scale=2.0, f_shift=2.0):
    """q, k (B, H, T, Dqk), v (B, H, T, Dv), gate pre-activations i ~ N(0, i_scale²) and
    f ~ N(f_shift, 1) (forget gates mostly open)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dqk, generator=g)
    k = torch.randn(B, H, T, Dqk, generator=g)
    v = torch.randn(B, H, T, Dv, generator=g)
    i = torch.randn(B, H, T, generator=g) * i_scale
    f = torch.randn(B, H, T, generator=g) + f_shift
    return [x.to(dtype) for x in (q, k, v, i, f)]


def mlstm_state(B=2, H=2, Dqk=16, Dv=32, seed=1, dtype=torch.float32):
    """A random mLSTM state (C, n, m) of moderate size."""
    g = torch.Generator().manual_seed(seed)
    return [
        (0.3 * torch.randn(B, H, Dqk, Dv, generator=g)).to(dtype),
        (0.3 * torch.randn(B, H, Dqk, generator=g)).to(dtype),
        torch.randn(B, H, generator=g).to(dtype),
    ]


def gated_delta_inputs(T, dk=16, dv=32, dtype=torch.float32, seed=0, gate="softplus", b=2, h=2):
    """Unit-norm q, k, v, a log-decay g <= 0 (-softplus, or logsigmoid(x + 2) for slow decay),
    beta in (0, 1), and an initial state S0 (float32)."""
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = F.normalize(rn(b, h, T, dk), dim=-1)
    k = F.normalize(rn(b, h, T, dk), dim=-1)
    v = rn(b, h, T, dv)
    g = -F.softplus(rn(b, h, T)) if gate == "softplus" else F.logsigmoid(rn(b, h, T) + 2.0)
    beta = torch.sigmoid(rn(b, h, T))
    S0 = 0.5 * rn(b, h, dk, dv)
    return [x.to(dtype) for x in (q, k, v, g, beta)] + [S0.to(torch.float32)]


def swa_inputs(B, Hq, Hkv, Tq, Tk, D, Dv, dtype=torch.float32, seed=0):
    """q (B, Hq, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), requiring gradients."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Tq, D, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, Hkv, Tk, D, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, Hkv, Tk, Dv, generator=g).to(dtype).requires_grad_()
    return q, k, v


def loss_weights(*shapes: tuple[int, ...], seed: int = 7) -> list[torch.Tensor]:
    """Random float64 weights of the given shapes: a loss sum_j (w_j · out_j) whose gradient
    reaches every element of every output."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]


def chunk_backends(op: str, *args) -> list:
    """pytest params, one per backend of ``op`` usable on these inputs (as mlstm_kernels
    tests every kernel it has)."""
    from swax.ops import available_backends

    return [pytest.param(name, id=name) for name in available_backends(op, *args)]


def grad_noise_floor(
    reference: Callable[..., Sequence[torch.Tensor]],
    inputs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    draws: int = 3,
    seed: int = 0,
    unit: float | Sequence[float] = U32,
) -> tuple[list[float], list[torch.Tensor]]:
    """:func:`noise_floor` for the gradients of sum_j (weights_j · reference_j) w.r.t. the
    inputs: (floor of each input's gradient, float64 gradients)."""

    def run(xs, dtype):
        return grads(lambda *a: reference(*a, dtype=dtype), xs, weights)[1]

    refs = run([x.double() for x in inputs], torch.float64)
    runs = [run([x.float() for x in inputs], torch.float32)]
    g = torch.Generator().manual_seed(seed)
    units = _units(unit, len(inputs))
    for _ in range(draws):
        pert = [
            x.double() * (1 + u * (2 * torch.rand(x.shape, generator=g, dtype=torch.float64) - 1))
            for x, u in zip(inputs, units)
        ]
        runs.append(run(pert, torch.float64))
    return [max(rel_err(r[j], refs[j]) for r in runs) for j in range(len(refs))], refs


def model_noise_floor(
    module: torch.nn.Module,
    fn: Callable[[torch.nn.Module], torch.Tensor],
    draws=2,
    seed=0,
    unit: float = U32,
) -> tuple[float, torch.Tensor]:
    """(floor, float64 output) for ``fn(module)`` at model level: the normwise change of the
    float64 output when every parameter of a float64 copy of ``module`` is perturbed by one
    float32 rounding (relative 2^-24, ``draws`` times): how much float32 rounding alone moves
    this output. Two float32 computations of it (e.g. chunked prefill and one full pass) then
    agree within ``2 * NOISE_FACTOR`` times the floor. ``unit``: U16 for a bfloat16 model."""
    import copy

    model64 = copy.deepcopy(module).double()
    with torch.no_grad():
        ref = fn(model64)
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(draws):
        m = copy.deepcopy(model64)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1 + unit * (2 * torch.rand(p.shape, generator=g, dtype=torch.float64) - 1))
            worst = max(worst, rel_err(fn(m), ref))
    return worst, ref


# ------------------------------------------------------------------------------ bfloat16 tiles

BF16_TILES = U16
"""Perturbation unit (``noise_floor``'s ``unit``) for the inputs a kernel takes as bfloat16
tiles: its products round their operands and results to bfloat16 (float32 accumulation), so
its error is that of a bfloat16 rounding of those inputs propagated through the op, measured on
the float64 reference; the gates and states it keeps in float32 get U32."""


def product_flops(func, args) -> tuple[str, torch.dtype, float, tuple] | None:
    """(name, operand dtype, FLOPs, output's last two sizes) of a matrix product ATen runs, or
    None for other ops."""
    name = func.__name__ if hasattr(func, "__name__") else str(func)
    base = name.split(".")[0]
    if base in ("mm", "bmm"):
        a, b = args[0], args[1]
    elif base in ("addmm", "baddbmm"):
        a, b = args[1], args[2]
    elif "scaled_dot_product" in base:
        q, k = args[0], args[1]
        return base, q.dtype, 4.0 * q.numel() * k.shape[-2], (q.shape[-2], k.shape[-2])
    else:
        return None
    return base, a.dtype, 2.0 * a.numel() * b.shape[-1], (a.shape[-2], b.shape[-1])


class ProductDtypes(TorchDispatchMode):
    """Records every matrix product (mm, bmm, addmm, baddbmm, fused attention) run inside it,
    inside swax's custom ops too: ``records`` of :func:`product_flops`. :meth:`share` is the
    FLOP share of the products in a dtype, :meth:`other` those in other dtypes."""

    def __init__(self):
        super().__init__()
        self.records: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rec = product_flops(func, args)
        if rec is not None:
            self.records.append(rec)
        if func.namespace == "swax":  # a custom op (the mLSTM kernel): run its Python body here
            from torch._library.custom_ops import _maybe_get_opdef

            with self:
                return _maybe_get_opdef(func)._init_fn(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))

    def share(self, dtype: torch.dtype) -> float:
        total = sum(r[2] for r in self.records)
        return sum(r[2] for r in self.records if r[1] == dtype) / total if total else 0.0

    def other(self, dtype: torch.dtype) -> list[tuple]:
        return [r for r in self.records if r[1] != dtype]
