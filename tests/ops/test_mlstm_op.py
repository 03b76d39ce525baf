"""Tests for swax.ops.mlstm against independent references.

References (never the op's own output):
* ``naive_mlstm`` (tests/helpers.py): a per-time-step loop written from the cell equations,
  run in float64.
* ``mlstm_kernels`` ``parallel--native_autograd`` run in float64 (forward and autograd).

Tolerances come from the precision (see tests/helpers.py). The op computes in float32 (except
the chunk kernel's bfloat16 tiles for bfloat16 inputs, held to one bfloat16 rounding of q, k, v:
tests/ops/test_bf16_kernels.py); the references run in float64 on the very same (dtype-rounded)
input values, so the difference is the op's own float32 rounding. It must stay within
``NOISE_FACTOR`` times the error that float32 rounding alone causes on those inputs (the loop
run in float32, and the float64 loop on inputs perturbed by one float32 rounding), measured per
test; a constant would fit one CPU's float32 kernels only (AVX-512, AVX2 and
``ATEN_CPU_CAPABILITY=default`` differ by 5x on long sequences). ``make test-isa`` runs these
tests under the other instruction sets too.
Results rounded to bfloat16 are bounded by ``BF16_TOL`` = 4 bfloat16 unit roundoffs (the
rounding of the result itself is one).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from swax.ops.mlstm import mlstm, mlstm_step
from tests.helpers import (
    BF16_TILES,
    NOISE_FACTOR,
    U16,
    U32,
    assert_close,
    assert_within_noise,
    grad_noise_floor,
    grads,
    mlstm_inputs,
    naive_mlstm,
    noise_floor,
    unit_roundoff,
)

pytestmark = pytest.mark.usefixtures("one_thread")

MODES = ["parallel", "chunk", "recurrent"]
B, H, DQK, DV = 2, 2, 16, 32
EPS = 1e-6
BF16_TOL = 4 * U16
BF16_UNITS = [BF16_TILES] * 3 + [U32] * 2
"""The chunk kernel takes bfloat16 q, k, v as bfloat16 tiles, the gates in float32
(tests/ops/test_bf16_kernels.py holds it to a tighter case)."""


# --------------------------------------------------------------------------- references


def mk_parallel(q, k, v, i, f, eps=EPS):
    mk = pytest.importorskip("mlstm_kernels.torch")
    return mk.get_mlstm_kernel("parallel--native_autograd")(q, k, v, i, f, eps=eps)


def _naive_outputs(q, k, v, i, f, *state, dtype=torch.float64):
    """naive_mlstm as a flat list [h, C, n, m] (an optional initial state after the inputs)."""
    h, (C, n, m) = naive_mlstm(q, k, v, i, f, state=state or None, dtype=dtype)
    return [h, C, n, m]


def _naive_h(q, k, v, i, f, dtype=torch.float64):
    return [naive_mlstm(q, k, v, i, f, dtype=dtype)[0]]


_FLOORS: dict = {}


def floors_of(key, inputs, state=(), unit=U32):
    """(float32 noise floors of h, C, n, m; their float64 values) for these inputs, cached by
    ``key`` (the same inputs are shared by the parametrisations over modes); ``unit``:
    BF16_UNITS for the chunk kernel's bfloat16 tiles."""
    if key not in _FLOORS:
        _FLOORS[key] = noise_floor(_naive_outputs, [*inputs, *state], unit=unit)
    return _FLOORS[key]


def float32_noise_floor(inputs, draws=3, seed=0):
    """Normwise error (max|x - ref| / max|ref|, per output: h, C, n, m) that float32 rounding
    alone causes on these inputs, and the float64 outputs (see helpers.noise_floor)."""
    return noise_floor(_naive_outputs, inputs, draws, seed)


def make_inputs(T, dtype=torch.float32, seed=0, b=B, h=H, dqk=DQK, dv=DV, i_scale=2.0, f_shift=2.0):
    return mlstm_inputs(T, b, h, dqk, dv, seed, dtype, i_scale, f_shift)


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
    floors, refs = floors_of(("fwd", T, dtype), inputs)
    h_mk = mk_parallel(*[x.double() for x in inputs])
    if dtype == torch.float32:
        assert_within_noise([h, h], floors[:1] * 2, [refs[0], h_mk], ["h vs naive", "h vs mk"])
    elif mode == "chunk":  # bfloat16 tiles: within the noise of one bfloat16 rounding of them
        floors = floors_of(("fwd16", T), inputs, unit=BF16_UNITS)[0]
        factor = NOISE_FACTOR + U16 / floors[0]  # + the rounding of h
        assert_within_noise([h, h], floors[:1] * 2, [refs[0], h_mk], ["h vs naive", "h"], factor)
    else:  # float32 math, h rounded to bfloat16
        assert_close(h, refs[0], BF16_TOL, "h vs naive")
        assert_close(h, h_mk, BF16_TOL, "h vs mlstm_kernels")
    # the state is float32 math on the same (dtype-rounded) inputs (tiles aside)
    assert_within_noise(state, floors[1:], refs[1:], "Cnm")


def test_references_agree():
    """The two references agree with each other to float64 rounding (guards the naive loop)."""
    x64 = [x.double() for x in make_inputs(50, seed=3)]
    assert_close(naive_mlstm(*x64)[0], mk_parallel(*x64), 2**10 * unit_roundoff(torch.float64))


@pytest.mark.parametrize("mode", MODES)
def test_output_final_state_flag_and_empty_sequence(mode):
    inputs = make_inputs(5)
    h, state = mlstm(*inputs, mode=mode)
    assert state is None
    h0, s0 = mlstm(*[x[:, :, :0] for x in inputs], mode=mode, output_final_state=True)
    assert h0.shape == (B, H, 0, DV)
    assert (s0[0] == 0).all() and (s0[1] == 0).all() and (s0[2] == -math.inf).all()


# --------------------------------------------------------------------------- backward

_GRAD_FLOORS: dict = {}


def grad_floors_of(key, inputs, dh):
    """(float32 noise floors of dq, dk, dv, di, df for the loss sum(h · dh); the float64
    gradients of the naive loop), cached by ``key``."""
    if key not in _GRAD_FLOORS:
        _GRAD_FLOORS[key] = grad_noise_floor(_naive_h, inputs, [dh.double()])
    return _GRAD_FLOORS[key]


def _op_grads(mode, chunk_size, inputs, dh):
    def h_of(*x):
        return [mlstm(*x, mode=mode, chunk_size=chunk_size)[0]]

    return grads(h_of, inputs, [dh.double()])[1]


@pytest.mark.parametrize("T", [1, 7, 64, 100, 200])
@pytest.mark.parametrize("mode,chunk_size", CASES)
def test_gradients_match_mlstm_kernels(mode, chunk_size, T):
    inputs = make_inputs(T, seed=100 + T)
    dh = torch.randn(B, H, T, DV, generator=torch.Generator().manual_seed(T))
    g = _op_grads(mode, chunk_size, inputs, dh)
    _, g_mk = grads(lambda *x: [mk_parallel(*x)], [x.double() for x in inputs], [dh.double()])
    floors, _ = grad_floors_of(("grad", T), inputs, dh)
    assert_within_noise(g, floors, g_mk, ["dq", "dk", "dv", "di", "df"])


@pytest.mark.parametrize("mode,chunk_size", [("parallel", 64), ("chunk", 16), ("recurrent", 64)])
def test_gradients_bfloat16(mode, chunk_size):
    T = 100
    inputs = make_inputs(T, torch.bfloat16, seed=7)
    dh = torch.randn(B, H, T, DV, generator=torch.Generator().manual_seed(8)).bfloat16()
    g = _op_grads(mode, chunk_size, inputs, dh)
    _, g_mk = grads(lambda *x: [mk_parallel(*x)], [x.double() for x in inputs], [dh.double()])
    tol = [BF16_TOL] * 5
    if mode == "chunk":  # bfloat16 tiles: within the noise of one bfloat16 rounding of them
        floors, _ = grad_noise_floor(_naive_h, inputs, [dh.double()], unit=BF16_UNITS)
        tol = [NOISE_FACTOR * f + U16 for f in floors]
    for name, a, e, t in zip("qkvif", g, g_mk, tol):
        assert a.dtype == torch.bfloat16
        assert_close(a, e, t, f"d{name}")


# --------------------------------------------------------------------------- state passing


@pytest.mark.parametrize("mode", MODES)
def test_state_passing_matches_one_pass(mode):
    T, cs = 200, 16
    inputs = make_inputs(T, seed=11)
    h_full, s_full = mlstm(*inputs, mode=mode, chunk_size=cs, output_final_state=True)
    floors, refs = floors_of(("split", T), inputs)
    for splits in ([1], [37], [16, 48], [1, 2, 3, 64, 100, 199]):
        h, s = run_chained(inputs, splits, mode, cs)
        assert_within_noise([h, *s], floors, refs, [f"{x} split {splits}" for x in "hCnm"])
        # two float32 results, each within the noise of the reference
        f2 = 2 * NOISE_FACTOR
        assert_within_noise([h], floors[:1], [h_full], [f"h vs one pass {splits}"], f2)
    assert_within_noise(s_full, floors[1:], refs[1:], "Cnm")


def test_final_states_agree_across_modes():
    inputs = make_inputs(100, seed=12)
    floors, refs = floors_of(("modes", 100), inputs)
    for m in MODES:
        state = mlstm(*inputs, mode=m, chunk_size=16, output_final_state=True)[1]
        assert_within_noise(state, floors[1:], refs[1:], [f"{x} {m}" for x in "Cnm"])


def test_step_chain_matches_sequence():
    T = 40
    inputs = make_inputs(T, seed=13)
    q, k, v, i, f = inputs
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
    floors, refs = floors_of(("step", T), inputs)
    assert_within_noise([h, *state], floors, refs, "hCnm")
    h_chunk = mlstm(q, k, v, i, f, mode="chunk", chunk_size=16)[0]
    assert_within_noise([h], floors, [h_chunk], ["h step vs chunk"], 2 * NOISE_FACTOR)


def test_prefill_then_decode():
    T, P = 50, 37
    inputs = make_inputs(T, seed=14)
    q, k, v, i, f = inputs
    h_pre, state = mlstm(*[x[:, :, :P] for x in inputs], output_final_state=True, chunk_size=16)
    hs = [h_pre]
    for t in range(P, T):
        h_t, state = mlstm_step(q[:, :, t], k[:, :, t], v[:, :, t], i[:, :, t], f[:, :, t], state)
        hs.append(h_t[:, :, None])
    floors, refs = floors_of(("prefill", T), inputs)
    assert_within_noise([torch.cat(hs, 2)], floors, refs, "h")


def _prefix_state(seed):
    """A realistic float32 state: the naive reference run over a random prefix."""
    _, (C, n, m) = naive_mlstm(*make_inputs(30, seed=seed))
    return C.float(), n.float(), m.float()


@pytest.mark.parametrize("mode,chunk_size", CASES)
def test_gradients_with_initial_state(mode, chunk_size):
    """Grads w.r.t. the inputs and the initial (C, n, m) vs float64 autograd of the naive loop."""
    T = 100
    inputs = make_inputs(T, seed=15)
    state0 = list(_prefix_state(seed=16))
    gen = torch.Generator()
    weights = [  # of h, C, n (m gets no weight: it only rescales)
        torch.randn(B, H, T, DV, generator=gen.manual_seed(17)).double(),
        torch.randn(B, H, DQK, DV, generator=gen.manual_seed(18)).double(),
        torch.randn(B, H, DQK, generator=gen.manual_seed(19)).double(),
    ]
    before = [s.clone() for s in state0]

    def op(q, k, v, i, f, C0, n0, m0):
        h, (C, n, m) = mlstm(
            q,
            k,
            v,
            i,
            f,
            initial_state=(C0, n0, m0),
            output_final_state=True,
            mode=mode,
            chunk_size=chunk_size,
        )
        return [h, C, n]

    leaves = [x.clone().requires_grad_() for x in (*inputs, *state0)]
    outs = op(*leaves)
    sum((o.double() * w).sum() for o, w in zip(outs, weights)).backward()
    g = [x.grad for x in leaves]
    for s, s0 in zip(leaves[5:], before):
        assert torch.equal(s.detach(), s0), "initial_state was modified in place"
    if ("init", T) not in _GRAD_FLOORS:
        _GRAD_FLOORS["init", T] = grad_noise_floor(
            lambda *x, dtype: _naive_outputs(*x, dtype=dtype)[:3], [*inputs, *state0], weights
        )
    floors, g_ref = _GRAD_FLOORS["init", T]
    names = ["dq", "dk", "dv", "di", "df", "dC0", "dn0", "dm0"]
    assert_within_noise(g, floors, g_ref, names)


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
    assert_within_noise([h.detach(), *state], floors, refs, "hCnm")


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
    assert_within_noise([h, *state], floors, refs, "hCnm")


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
