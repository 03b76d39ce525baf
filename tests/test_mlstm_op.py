"""Tests for swax.ops.mlstm against independent references.

References (never the op's own output):
* ``naive``: a float64 per-time-step loop written here straight from the formulas.
* ``mlstm_kernels`` ``parallel--native_autograd`` run in float64 (forward and autograd).

Tolerances. The op computes in float32 whatever its input dtype; the references run in
float64 on the very same (dtype-rounded) input values, so the difference is the op's own
float32 rounding. Outputs are sums of <= T (200) terms each carrying ~1e-7 relative error,
divided by a denominator that can be small, so errors are measured normwise: elementwise
``|x - ref| <= tol * (|ref| + max|ref|)``. Forward ``tol = 1e-5``, gradients ``tol = 1e-4``
(one more matmul/exp chain, and near-cancelling denominators amplify more; mlstm_kernels'
own float32 result is off from float64 by up to ~1e-4 on these inputs). bfloat16 inputs:
the result is rounded to bfloat16 (relative step 2^-8 = 4e-3), so ``tol = 2e-2``.

Long or extreme-gate sequences are ill-conditioned: there the float32 error depends on the
inputs and on the CPU's float32 kernels (AVX-512, AVX2, ``ATEN_CPU_CAPABILITY=default`` differ
by 5x), so those tests bound the op's error by a multiple of the float32 noise floor measured on
the same inputs (:func:`float32_noise_floor`) instead of a fixed constant. ``make test-isa`` runs
these tests under the other instruction sets too.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from swax.ops.mlstm import mlstm, mlstm_step

MODES = ["parallel", "chunk", "recurrent"]
B, H, DQK, DV = 2, 2, 16, 32
EPS = 1e-6
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
GRAD_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


# --------------------------------------------------------------------------- references


def naive_mlstm(q, k, v, i, f, state=None, eps=EPS, dtype=torch.float64):
    """Loop over time, straight from the cell equations, in ``dtype`` (float64: the reference;
    float32: the rounding a plain float32 implementation makes). Returns h, (C, n, m)."""
    q, k, v, i, f = (x.to(dtype) for x in (q, k, v, i, f))
    Bq, Hq, T, Dqk = q.shape
    Dv = v.shape[-1]
    if state is None:
        C = q.new_zeros(Bq, Hq, Dqk, Dv)
        n = q.new_zeros(Bq, Hq, Dqk)
        m = q.new_full((Bq, Hq), -math.inf)
    else:
        C, n, m = (x.to(dtype) for x in state)
    hs = []
    for t in range(T):
        logf = F.logsigmoid(f[:, :, t])
        m_new = torch.maximum(logf + m, i[:, :, t])
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
    return torch.stack(hs, 2), (C, n, m)


def mk_parallel(q, k, v, i, f, eps=EPS):
    mk = pytest.importorskip("mlstm_kernels.torch")
    return mk.get_mlstm_kernel("parallel--native_autograd")(q, k, v, i, f, eps=eps)


# --------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: intra-op threads only add sync overhead (large on a busy 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_inputs(T, dtype=torch.float32, seed=0, b=B, h=H, dqk=DQK, dv=DV, i_scale=2.0, f_shift=2.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, T, dqk, generator=g)
    k = torch.randn(b, h, T, dqk, generator=g)
    v = torch.randn(b, h, T, dv, generator=g)
    i = torch.randn(b, h, T, generator=g) * i_scale
    f = torch.randn(b, h, T, generator=g) + f_shift
    return [x.to(dtype) for x in (q, k, v, i, f)]


def assert_near(actual, expected, tol, what=""):
    """Normwise-relative check: |a - e| <= tol * (|e| + max|e|) elementwise."""
    a, e = actual.double(), expected.double()
    assert torch.isfinite(a).all(), f"{what}: non-finite values"
    scale = e.abs().max().clamp_min(1e-30)
    bound = tol * (e.abs() + scale)
    err = (a - e).abs()
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{what}: max err {err.max().item():.3e}, scale {scale.item():.3e}"


def float32_noise_floor(inputs, draws=3, seed=0):
    """Normwise error (max|x - ref| / max|ref|, per output: h, C, n, m) that float32 rounding
    alone causes on these inputs: the larger of (a) the naive loop run in float32 and (b) the
    float64 loop on inputs perturbed by one float32 rounding (relative 2^-24, ``draws`` times).
    Long or near-cancelling sequences are ill-conditioned, so this floor depends on the inputs
    and on the CPU's float32 kernels; a test bounds an op's error by a multiple of it instead
    of a constant fitted to one machine."""
    h64, s64 = naive_mlstm(*inputs)
    refs = [h64, *s64]
    runs = [[h, *s] for h, s in [naive_mlstm(*inputs, dtype=torch.float32)]]
    g = torch.Generator().manual_seed(seed)
    for _ in range(draws):
        pert = [
            x.double()
            * (1 + 2.0**-24 * (2 * torch.rand(x.shape, generator=g, dtype=torch.float64) - 1))
            for x in inputs
        ]
        h, s = naive_mlstm(*pert)
        runs.append([h, *s])
    return [max(normwise_err(r[j], refs[j]) for r in runs) for j in range(4)], refs


def normwise_err(actual, expected):
    """max|actual - expected| / max|expected| (0 for empty tensors)."""
    if not expected.numel():
        return 0.0
    a, e = actual.double(), expected.double()
    assert torch.isfinite(a).all(), "non-finite values"
    return ((a - e).abs().max() / e.abs().max().clamp_min(1e-30)).item()


NOISE_FACTOR = 8
"""An op may be at most this many times worse than float32's own noise floor (float32 rounding
of a chunkwise kernel compounds over more operations than the sequential loop; a real defect
gives errors of order 1)."""
FLOOR = 2.0**-24 * 16
"""Absolute normwise floor for outputs the loop happens to compute exactly (e.g. m)."""


def assert_within_noise(outputs, floors, refs, names="hCnm"):
    for a, floor, e, name in zip(outputs, floors, refs, names):
        err, bound = normwise_err(a, e), NOISE_FACTOR * floor + FLOOR
        assert err <= bound, (
            f"{name}: normwise error {err:.3e} > {NOISE_FACTOR} x float32 "
            f"noise floor {floor:.3e} (+{FLOOR:.1e})"
        )


def run_chained(inputs, splits, mode, chunk_size, state=None):
    """Run mlstm over consecutive pieces cut at ``splits``, passing the state along."""
    T = inputs[0].shape[2]
    bounds = [0, *splits, T]
    hs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        piece = [x[:, :, lo:hi] for x in inputs]
        h, state = mlstm(
            *piece, initial_state=state, output_final_state=True, mode=mode, chunk_size=chunk_size
        )
        hs.append(h)
    return torch.cat(hs, 2), state


CASES = [(mode, cs) for mode in ("parallel", "chunk") for cs in (64, 16)] + [("recurrent", 64)]


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("T", [1, 7, 64, 100, 200])
@pytest.mark.parametrize("mode,chunk_size", CASES)
def test_forward_matches_references(mode, chunk_size, T, dtype):
    inputs = make_inputs(T, dtype, seed=T)
    h, state = mlstm(*inputs, mode=mode, chunk_size=chunk_size, output_final_state=True)
    assert h.dtype == dtype and h.shape == (B, H, T, DV)
    assert all(s.dtype == torch.float32 for s in state)
    x64 = [x.double() for x in inputs]
    h_naive, (C, n, m) = naive_mlstm(*x64)
    h_mk = mk_parallel(*x64)
    tol = TOL[dtype]
    assert_near(h, h_naive, tol, "h vs naive")
    assert_near(h, h_mk, tol, "h vs mlstm_kernels")
    # The state is float32 math on exact inputs for bf16 too, so keep the tight tolerance.
    assert_near(state[0], C, 1e-5, "C")
    assert_near(state[1], n, 1e-5, "n")
    assert_near(state[2], m, 1e-6, "m")


def test_references_agree():
    """The two references agree with each other (guards the test's own naive loop)."""
    x64 = [x.double() for x in make_inputs(50, seed=3)]
    torch.testing.assert_close(naive_mlstm(*x64)[0], mk_parallel(*x64), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", MODES)
def test_output_final_state_flag_and_empty_sequence(mode):
    inputs = make_inputs(5)
    h, state = mlstm(*inputs, mode=mode)
    assert state is None
    h0, s0 = mlstm(*[x[:, :, :0] for x in inputs], mode=mode, output_final_state=True)
    assert h0.shape == (B, H, 0, DV)
    assert (s0[0] == 0).all() and (s0[1] == 0).all() and (s0[2] == -math.inf).all()


# --------------------------------------------------------------------------- backward


def _grads(fn, inputs, dh):
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*xs)
    out.backward(dh.to(out.dtype))
    return out, [x.grad for x in xs]


@pytest.mark.parametrize("T", [1, 7, 64, 100, 200])
@pytest.mark.parametrize("mode,chunk_size", CASES)
def test_gradients_match_mlstm_kernels(mode, chunk_size, T):
    inputs = make_inputs(T, seed=100 + T)
    dh = torch.randn(B, H, T, DV, generator=torch.Generator().manual_seed(T))
    _, g = _grads(lambda *x: mlstm(*x, mode=mode, chunk_size=chunk_size)[0], inputs, dh)
    _, g_ref = _grads(mk_parallel, [x.double() for x in inputs], dh.double())
    for name, a, e in zip("qkvif", g, g_ref):
        assert_near(a, e, GRAD_TOL[torch.float32], f"d{name}")


@pytest.mark.parametrize("mode,chunk_size", [("parallel", 64), ("chunk", 16), ("recurrent", 64)])
def test_gradients_bfloat16(mode, chunk_size):
    T = 100
    inputs = make_inputs(T, torch.bfloat16, seed=7)
    dh = torch.randn(B, H, T, DV, generator=torch.Generator().manual_seed(8))
    dh = dh.bfloat16()
    _, g = _grads(lambda *x: mlstm(*x, mode=mode, chunk_size=chunk_size)[0], inputs, dh)
    _, g_ref = _grads(mk_parallel, [x.double() for x in inputs], dh.double())
    for name, a, e in zip("qkvif", g, g_ref):
        assert a.dtype == torch.bfloat16
        assert_near(a, e, GRAD_TOL[torch.bfloat16], f"d{name}")


# --------------------------------------------------------------------------- state passing


@pytest.mark.parametrize("mode", MODES)
def test_state_passing_matches_one_pass(mode):
    T, cs = 200, 16
    inputs = make_inputs(T, seed=11)
    h_full, s_full = mlstm(*inputs, mode=mode, chunk_size=cs, output_final_state=True)
    h_naive, s_naive = naive_mlstm(*[x.double() for x in inputs])
    for splits in ([1], [37], [16, 48], [1, 2, 3, 64, 100, 199]):
        h, s = run_chained(inputs, splits, mode, cs)
        assert_near(h, h_naive, TOL[torch.float32], f"h split {splits}")
        assert_near(h, h_full, TOL[torch.float32], f"h vs one pass, split {splits}")
        for a, e, name in zip(s, s_naive, "Cnm"):
            assert_near(a, e, 1e-5, f"{name} split {splits}")
    for a, e, name in zip(s_full, s_naive, "Cnm"):
        assert_near(a, e, 1e-5, f"{name} one pass")


def test_final_states_agree_across_modes():
    inputs = make_inputs(100, seed=12)
    states = {m: mlstm(*inputs, mode=m, chunk_size=16, output_final_state=True)[1] for m in MODES}
    for m in ("parallel", "chunk"):
        for a, e, name in zip(states[m], states["recurrent"], "Cnm"):
            assert_near(a, e, 1e-5, f"{name} {m} vs recurrent")


def test_step_chain_matches_sequence():
    T = 40
    q, k, v, i, f = make_inputs(T, seed=13)
    state = None
    hs = []
    for t in range(T):
        h_t, new_state = mlstm_step(
            q[:, :, t], k[:, :, t], v[:, :, t], i[:, :, t], f[:, :, t], state
        )
        assert h_t.shape == (B, H, DV) and new_state[0].dtype == torch.float32
        hs.append(h_t)
        state = new_state
    h = torch.stack(hs, 2)
    h_naive, s_naive = naive_mlstm(q, k, v, i, f)
    assert_near(h, h_naive, TOL[torch.float32], "h")
    h_chunk, s_chunk = mlstm(q, k, v, i, f, mode="chunk", chunk_size=16, output_final_state=True)
    assert_near(h, h_chunk, TOL[torch.float32], "h step vs chunk")
    for a, e, name in zip(state, s_naive, "Cnm"):
        assert_near(a, e, 1e-5, name)


def test_prefill_then_decode():
    T, P = 50, 37
    q, k, v, i, f = make_inputs(T, seed=14)
    h_pre, state = mlstm(
        q[:, :, :P],
        k[:, :, :P],
        v[:, :, :P],
        i[:, :, :P],
        f[:, :, :P],
        output_final_state=True,
        chunk_size=16,
    )
    hs = [h_pre]
    for t in range(P, T):
        h_t, state = mlstm_step(q[:, :, t], k[:, :, t], v[:, :, t], i[:, :, t], f[:, :, t], state)
        hs.append(h_t[:, :, None])
    assert_near(torch.cat(hs, 2), naive_mlstm(q, k, v, i, f)[0], TOL[torch.float32], "h")


def _prefix_state(seed):
    """A realistic float32 state: the naive reference run over a random prefix."""
    _, (C, n, m) = naive_mlstm(*make_inputs(30, seed=seed))
    return C.float(), n.float(), m.float()


@pytest.mark.parametrize("mode,chunk_size", CASES)
def test_gradients_with_initial_state(mode, chunk_size):
    """Grads w.r.t. the inputs and the initial (C, n, m) vs float64 autograd of the naive loop."""
    T = 100
    inputs = make_inputs(T, seed=15)
    state0 = _prefix_state(seed=16)
    dh = torch.randn(B, H, T, DV, generator=torch.Generator().manual_seed(17))
    dC = torch.randn(B, H, DQK, DV, generator=torch.Generator().manual_seed(18))
    dn = torch.randn(B, H, DQK, generator=torch.Generator().manual_seed(19))

    def loss(fn, xs, st):
        h, (C, n, m) = fn(xs, st)
        return (h * dh.to(h.dtype)).sum() + (C * dC.to(C.dtype)).sum() + (n * dn.to(n.dtype)).sum()

    xs = [x.clone().requires_grad_() for x in inputs]
    st = [s.clone().requires_grad_() for s in state0]
    st_before = [s.detach().clone() for s in st]
    loss(
        lambda a, s: mlstm(
            *a, initial_state=tuple(s), output_final_state=True, mode=mode, chunk_size=chunk_size
        ),
        xs,
        st,
    ).backward()
    for s, s0 in zip(st, st_before):
        assert torch.equal(s.detach(), s0), "initial_state was modified in place"

    xr = [x.double().requires_grad_() for x in inputs]
    sr = [s.double().requires_grad_() for s in state0]
    loss(lambda a, s: naive_mlstm(*a, state=s), xr, sr).backward()
    for name, a, e in zip(["q", "k", "v", "i", "f", "C0", "n0", "m0"], xs + st, xr + sr):
        assert a.grad is not None, name
        assert_near(a.grad, e.grad, GRAD_TOL[torch.float32], f"d{name}")


# --------------------------------------------------------------------------- extremes


@pytest.mark.parametrize("mode,chunk_size", CASES)
@pytest.mark.parametrize("gates", ["i_pm15", "f_very_negative", "f_very_positive", "mixed"])
def test_gate_extremes(mode, chunk_size, gates):
    T = 100
    q, k, v, i, f = make_inputs(T, seed=20)
    sign = torch.randint(0, 2, i.shape, generator=torch.Generator().manual_seed(21)) * 2 - 1
    if gates == "i_pm15":
        i = 15.0 * sign.float()
    elif gates == "f_very_negative":
        f = torch.full_like(f, -30.0)
    elif gates == "f_very_positive":
        f, i = torch.full_like(f, 30.0), -15.0 * torch.ones_like(i)
    else:
        i, f = 15.0 * sign.float(), -15.0 * sign.flip(-1).float()
    inputs = [q, k, v, i, f]
    xs = [x.clone().requires_grad_() for x in inputs]
    h, state = mlstm(*xs, mode=mode, chunk_size=chunk_size, output_final_state=True)
    h.sum().backward()
    assert torch.isfinite(h).all()
    assert all(torch.isfinite(s).all() for s in state)
    assert all(torch.isfinite(x.grad).all() for x in xs)
    floors, refs = float32_noise_floor(inputs)
    assert_within_noise([h.detach(), *state], floors, refs)


def test_long_sequence_state_passing_is_stable():
    """Soft-capped gates, many chunked calls chained by state: matches float64 throughout."""
    T, piece = 3000, 512
    q, k, v, i, f = make_inputs(T, seed=22, b=1, h=2, dqk=8, dv=8, i_scale=10.0, f_shift=0.0)
    i, f = 15 * torch.tanh(i / 15), 15 * torch.tanh(f * 5 / 15)
    inputs = [q, k, v, i, f]
    with torch.no_grad():
        h, state = run_chained(inputs, list(range(piece, T, piece)), "chunk", 64)
    # The sequence is ill-conditioned (i up to ±15, long runs of near-cancelling normaliser):
    # the float32 noise floor of h is ~1e-4 and varies with the CPU's kernels (AVX2, AVX-512,
    # ATEN_CPU_CAPABILITY=default), so the bound is derived from it rather than fixed.
    floors, refs = float32_noise_floor(inputs)
    assert_within_noise([h, *state], floors, refs)


# --------------------------------------------------------------------------- bad input


def _bad_cases():
    q, k, v, i, f = make_inputs(7)
    good = dict(q=q, k=k, v=v, i=i, f=f)
    C, n, m = torch.zeros(B, H, DQK, DV), torch.zeros(B, H, DQK), torch.zeros(B, H)

    def c(msg, **kw):
        return pytest.param({**good, **kw}, msg, id=msg)

    return [
        c("(2, 2, 16)", q=q[:, :, 0]),
        c("(2, 2, 7, 8)", k=k[..., :8]),
        c("(2, 2, 5, 32)", v=v[:, :, :5]),
        c("(1, 2, 7, 32)", v=v[None, 0]),
        c("(2, 2, 6)", i=i[:, :, :6]),
        c("(2, 2, 7, 1)", f=f[..., None]),
        c("torch.int64", i=i.long()),
        c("'fast'", mode="fast"),
        c("chunk_size", chunk_size=0),
        c("-4", chunk_size=-4),
        c("(2, 2, 16, 31)", initial_state=(C[..., :31], n, m)),
        c("(2, 2, 32)", initial_state=(C, torch.zeros(B, H, DV), m)),
        c("(2, 2, 1)", initial_state=(C, n, m[..., None])),
        c("length 2", initial_state=(C, n)),
    ]


@pytest.mark.parametrize("kwargs,msg", _bad_cases())
def test_bad_inputs_raise(kwargs, msg):
    kwargs = dict(kwargs)
    args = [kwargs.pop(x) for x in "qkvif"]
    with pytest.raises(ValueError) as exc:
        mlstm(*args, **kwargs)
    assert msg in str(exc.value)


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="'chunk'") as exc:
        mlstm(*make_inputs(3), mode="Chunk")
    assert "'Chunk'" in str(exc.value) and "'parallel'" in str(exc.value)


def test_step_bad_inputs_raise():
    q, k, v, i, f = (x[:, :, 0] for x in make_inputs(1))
    with pytest.raises(ValueError, match=r"\(2, 2, 1, 16\)"):
        mlstm_step(q[:, :, None], k, v, i, f, None)
    with pytest.raises(ValueError, match=r"\(2, 2, 2\)"):
        mlstm_step(q, k, v, i, f[..., None].expand(B, H, 2), None)
    with pytest.raises(ValueError, match=r"\(2, 2, 1\)"):
        mlstm_step(
            q,
            k,
            v,
            i,
            f,
            (torch.zeros(B, H, DQK, DV), torch.zeros(B, H, DQK), torch.zeros(B, H, 1)),
        )


# --------------------------------------------------------------------------- memory


class _MaxNumel(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


def test_chunk_mode_never_materialises_t_by_t():
    T, cs = 8192, 64
    inputs = make_inputs(T, b=1, h=1, dqk=4, dv=4, seed=23)
    with torch.no_grad(), _MaxNumel() as tracker:
        h, _ = mlstm(*inputs, mode="chunk", chunk_size=cs, output_final_state=True)
    assert torch.isfinite(h).all()
    assert tracker.max_numel <= 2 * T * cs, tracker.max_numel  # T*cs for the chunk tiles
    assert tracker.max_numel < T * T // 64
    # The tracker can see a T x T tensor: parallel mode at a small T makes one.
    small = [x[:, :, :256] for x in inputs]
    with torch.no_grad(), _MaxNumel() as tracker:
        mlstm(*small, mode="parallel")
    assert tracker.max_numel >= 256 * 256
