"""Op backends: the registry, every mLSTM and Gated DeltaNet backend usable here against the
float64 references (one parametrisation per backend, as mlstm_kernels tests its kernels), the
native mLSTM kernel's own checks, and torch.compile of every op.

References are independent of the code under test: the float64 per-step loops of
tests/helpers.py written from the equations, and ``torch.autograd.gradcheck`` (finite
differences) in float64. Tolerances come from the precision: an op is within ``NOISE_FACTOR``
times float32's own noise on the same inputs (tests/helpers.py).
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F

from swax.ops import (
    available_backends,
    gated_delta_rule,
    list_backends,
    mlstm,
    select_backend,
    sliding_window_attention,
)
from swax.ops.mlstm import chunkwise_fwd as kernel_fwd
from swax.ops.mlstm.chunkwise import mlstm_chunkwise
from tests.helpers import (
    NOISE_FACTOR,
    assert_within_noise,
    chunk_backends,
    grad_noise_floor,
    grads,
    loss_weights,
    mlstm_inputs,
    mlstm_state,
    naive_gated_delta,
    naive_mlstm,
    naive_swa,
    noise_floor,
    rel_err,
)

pytestmark = pytest.mark.usefixtures("one_thread")

EPS = 1e-6
D, DV = 8, 12


def inputs(T, B=2, H=2, D=D, Dv=DV, seed=0, dtype=torch.float32, f_shift=2.0):
    return mlstm_inputs(T, B, H, D, Dv, seed, dtype, f_shift=f_shift)


def state0(B=2, H=2, D=D, Dv=DV, seed=1, dtype=torch.float32):
    return mlstm_state(B, H, D, Dv, seed, dtype)


def weights_hCnm(T, B=2, H=2, seed=7):
    """Loss weights of (h, C, n, m)."""
    return loss_weights((B, H, T, DV), (B, H, D, DV), (B, H, D), (B, H), seed=seed)


def _naive_hCnm(q, k, v, i, f, *state, dtype=torch.float64):
    h, (C, n, m) = naive_mlstm(q, k, v, i, f, state=state or None, dtype=dtype)
    return [h, C, n, m]


EXTREME_GRAD_FACTOR = 4 * NOISE_FACTOR
"""Gradients on extreme gates may be this many times worse than float32's noise floor: the
native kernel forms the log-gate gradients as reverse cumulative sums of float32 terms whose
large opposite parts cancel (closing forget gates: sums of -30 per step), where the loop's
autograd cancels them step by step; observed up to 8.6x with ATEN_CPU_CAPABILITY=default and
3.5x with AVX2, against at most 2.4x on ordinary gates."""


def check_mlstm_backend(backend, xs, st, chunk, seed_w=7, grad_factor=NOISE_FACTOR):
    """Forward, final state and every gradient (inputs, initial state) of ``backend`` against
    the float64 loop, each within the float32 noise of these inputs (gradients within
    ``grad_factor`` times it)."""
    T = xs[0].shape[2]
    W = weights_hCnm(T, seed=seed_w)
    leaves = [*xs, *(st or [])]

    def op(q, k, v, i, f, *s):
        h, (C, n, m) = mlstm(
            q,
            k,
            v,
            i,
            f,
            initial_state=tuple(s) if s else None,
            output_final_state=True,
            chunk_size=chunk,
            backend=backend,
        )
        return [h, C, n, m]

    outs, g = grads(op, leaves, W)
    floors, refs = noise_floor(_naive_hCnm, leaves)
    assert_within_noise(outs, floors, refs, "hCnm")
    gfloors, g_ref = grad_noise_floor(_naive_hCnm, leaves, W)
    names = ["dq", "dk", "dv", "di", "df", "dC0", "dn0", "dm0"]
    assert_within_noise(g, gfloors, g_ref, [f"{n} ({backend})" for n in names], grad_factor)


MLSTM_BACKENDS = chunk_backends("mlstm", *inputs(8))
GATED_DELTA_BACKENDS = chunk_backends(
    "gated_delta",
    *[F.normalize(x, dim=-1) for x in inputs(8)[:2]],
    inputs(8)[2],
    -F.softplus(inputs(8)[3]),
    torch.sigmoid(inputs(8)[4]),
    None,
)


# --------------------------------------------------------------------------- registry


def test_backend_names_and_priorities():
    assert list_backends("mlstm") == ["triton", "native", "autograd"]
    assert list_backends("gated_delta") == ["fla", "native"]
    assert list_backends("swa")[0] == "flash"
    q, k, v, i, f = inputs(20)
    assert select_backend("mlstm", None, q, k, v, i, f).name == (
        "triton" if "triton" in available_backends("mlstm", q, k, v, i, f) else "native"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU")
def test_gpu_backends_named_on_cpu_are_an_error_and_auto_falls_back(monkeypatch):
    """A backend asked for by name that cannot run is an error saying why (no quiet
    substitute); "auto" takes the next usable one, the same numbers as naming it."""
    from swax.ops.registry import BackendUnavailableError, record_backends

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v, i, f = inputs(20)
    with pytest.raises(BackendUnavailableError) as e:
        mlstm(q, k, v, i, f, backend="triton")
    assert str(e.value).startswith("mlstm backend 'triton' is not available: ")
    assert str(e.value).endswith("; use backend=auto to fall back") and e.value.reason
    assert isinstance(e.value, ValueError)
    with record_backends() as calls:
        h, _ = mlstm(q, k, v, i, f, backend="auto")
    assert calls == [("mlstm", "native")]
    torch.testing.assert_close(h, mlstm(q, k, v, i, f, backend="native")[0], rtol=0, atol=0)
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    g, beta = -F.softplus(i), torch.sigmoid(f)
    with pytest.raises(BackendUnavailableError, match="gated_delta backend 'fla' is not avail"):
        gated_delta_rule(qn, kn, v, g, beta, backend="fla")
    o, _ = gated_delta_rule(qn, kn, v, g, beta)
    torch.testing.assert_close(
        o, gated_delta_rule(qn, kn, v, g, beta, backend="native")[0], rtol=0, atol=0
    )


def test_record_backends_sees_every_call_and_each_fallback(monkeypatch):
    """What a gpu test relies on to know that the kernel it names ran: each call's backend,
    what "auto" took, and nothing for a named backend that cannot run (it raises)."""
    from swax.ops.registry import BackendUnavailableError, record_backends

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, v, i, f = inputs(20)
    triton = "triton" in available_backends("mlstm", q, k, v, i, f)
    with record_backends() as calls:
        mlstm(q, k, v, i, f, backend="autograd")
        if not triton:  # no CUDA, no interpreter
            with pytest.raises(BackendUnavailableError):
                mlstm(q, k, v, i, f, backend="triton")
        mlstm(q, k, v, i, f)  # auto
        sliding_window_attention(q, k, v, 4, backend="reference")
    auto = "triton" if triton else "native"
    assert calls == [("mlstm", "autograd"), ("mlstm", auto), ("swa", "reference")]
    with record_backends() as outer, record_backends() as inner:
        mlstm(q, k, v, i, f, backend="native")
    assert outer == inner == [("mlstm", "native")]


def _toy_op(name_ok: str, fail_first: list, monkeypatch):
    """A throw-away op with a guarded kernel "k" (raising while ``fail_first`` is non-empty)
    and a plain backend "plain", in a copy of the registry that the test ends with."""
    from swax.ops import registry
    from swax.ops.registry import register_backend

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "FAILURES", registry.FailureRecord())

    def kernel(x, *rest):
        if fail_first:
            fail_first.pop()
            raise RuntimeError("Block pointers have been removed\nsecond line")
        return x + 1

    op = f"toy_{name_ok}"
    register_backend(op, "k", kernel, priority=20, guard_first_call=True)
    register_backend(op, "plain", lambda x, *rest: x + 2, priority=10)
    return op


def test_a_kernel_failing_at_its_first_call_falls_back_once_and_says_why(caplog, monkeypatch):
    from swax.ops.registry import backend_report, select_backend

    op = _toy_op("fails", [1], monkeypatch)
    x = torch.zeros(3)
    with caplog.at_level("WARNING", logger="swax"):
        first = select_backend(op, None, x).fn(x)
        second = select_backend(op, None, x)
    assert first.tolist() == [2.0] * 3  # the plain backend's answer, not an exception
    assert second.name == "plain"
    assert caplog.text.count("its first call failed") == 1
    assert "RuntimeError: second line" in caplog.text
    row = next(r for r in backend_report() if r["op"] == op and r["name"] == "k")
    assert row["reason"] and "first call failed" in row["reason"]


def test_a_kernel_that_ran_once_is_not_masked_later(monkeypatch):
    from swax.ops.registry import select_backend

    op = _toy_op("later", [], monkeypatch)
    x = torch.zeros(3)
    b = select_backend(op, None, x)
    assert b.name == "k" and b.fn(x).tolist() == [1.0] * 3
    # the guard is off after one success: a later error propagates
    with pytest.raises(TypeError):
        b.fn("not a tensor")


def test_triton_backends_need_cuda_or_the_interpreter(monkeypatch):
    from swax.ops.triton_env import device_problem, interpreting

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not interpreting()
    assert "TRITON_INTERPRET=1" in device_problem("cpu")
    assert device_problem("cuda") is None and "mps" in device_problem("mps")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert interpreting() and device_problem("cpu") is None


@pytest.mark.parametrize(
    "doc,expect",
    [
        ("Block pointers have been removed. Use a tensor descriptor instead.", "removed"),
        ("Returns a pointer to a block in a parent tensor.", None),
        (None, "removed"),  # no make_block_ptr at all
    ],
)
def test_triton_without_block_pointers_is_named_unusable(monkeypatch, doc, expect):
    """Triton 3.9 keeps tl.make_block_ptr as a stub that raises; mlstm_kernels 2.0.x calls it.
    A stand-in triton module of each kind: the reason names the installed version."""
    import types

    from swax.ops import triton_env

    lang = types.ModuleType("triton.language")
    if doc is not None:

        def make_block_ptr(*a, **k):
            pass

        make_block_ptr.__doc__ = doc
        lang.make_block_ptr = make_block_ptr
    fake = types.ModuleType("triton")
    fake.__version__ = "9.9.9"
    fake.language = lang
    monkeypatch.setitem(sys.modules, "triton", fake)
    monkeypatch.setitem(sys.modules, "triton.language", lang)
    triton_env.triton_problem.cache_clear()
    try:
        reason = triton_env.triton_problem()
    finally:
        triton_env.triton_problem.cache_clear()
    if expect is None:
        assert reason is None
    else:
        assert "9.9.9" in reason and "make_block_ptr" in reason


def test_backend_report_lists_packages_and_reasons(monkeypatch):
    from swax.ops.registry import backend_report

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = {(r["op"], r["name"]): r for r in backend_report("cpu")}
    assert set(rows) >= {("mlstm", "triton"), ("gated_delta", "fla"), ("swa", "flash")}
    assert rows[("mlstm", "native")]["reason"] is None
    assert "CUDA" in rows[("mlstm", "triton")]["reason"]
    assert set(rows[("mlstm", "triton")]["packages"]) == {"mlstm_kernels", "triton"}
    assert rows[("swa", "flex")]["packages"]["torch"] == torch.__version__


def test_gated_deltanet_hands_the_kernel_its_autocast_dtype(monkeypatch):
    """Under bfloat16 autocast the residual stream stays float32; q and k must still reach the
    op in bfloat16 (fla's kernel takes only 16-bit inputs), like v from its projection."""
    import swax.layers.gated_deltanet as gdn

    seen = []

    def spy(q, k, v, *a, **kw):
        seen.append((q.dtype, k.dtype, v.dtype))
        return gated_delta_rule(q, k, v, *a, **kw)

    monkeypatch.setattr(gdn, "gated_delta_rule", spy)
    layer = gdn.GatedDeltaNetLayer(32, 2)
    x = torch.randn(1, 20, 32)
    layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)
    assert seen == [(torch.float32,) * 3, (torch.bfloat16,) * 3]


def test_unknown_backend_is_an_error_naming_the_choices():
    q, k, v, i, f = inputs(5)
    for mode in ("chunk", "parallel"):
        with pytest.raises(ValueError, match="'nope'") as e:
            mlstm(q, k, v, i, f, mode=mode, backend="nope")
        assert "native" in str(e.value)
    with pytest.raises(ValueError, match="'nope'"):
        gated_delta_rule(q, k, v, -F.softplus(i), torch.sigmoid(f), backend="nope")


# --------------------------------------------------------------------------- mLSTM backends


@pytest.mark.parametrize("backend", MLSTM_BACKENDS)
@pytest.mark.parametrize("T,chunk", [(1, 64), (7, 64), (64, 16), (100, 16), (100, 64), (200, 32)])
@pytest.mark.parametrize("with_state", [False, True], ids=["empty", "state"])
def test_mlstm_backend_matches_float64_loop(backend, T, chunk, with_state):
    check_mlstm_backend(backend, inputs(T, seed=T), state0() if with_state else None, chunk)


@pytest.mark.parametrize("backend", MLSTM_BACKENDS)
@pytest.mark.parametrize("case", ["closing_forget_gates", "i_pm15", "large_state_m"])
def test_mlstm_backend_extreme_gates(backend, case):
    """Gates that make chunks of the native kernel take the exact path (or stress the
    stabiliser): finite, and within float32 noise of the float64 loop, forward and backward."""
    T = 96
    q, k, v, i, f = inputs(T, seed=11)
    st = None
    if case == "closing_forget_gates":
        f = torch.where(torch.arange(T) % 32 < 16, -30.0, 5.0).expand_as(f).clone()
    elif case == "i_pm15":
        i = 15 * torch.sign(i)
    else:
        st = state0()
        st[2] = st[2] + 40.0
    check_mlstm_backend(backend, [q, k, v, i, f], st, 32, grad_factor=EXTREME_GRAD_FACTOR)


# --------------------------------------------------------------------------- native mLSTM


@pytest.mark.parametrize("exact", [False, True], ids=["factorised", "exact"])
@pytest.mark.parametrize("with_state", [False, True], ids=["empty", "state"])
def test_kernel_gradcheck_float64(exact, with_state, monkeypatch):
    """Finite differences in float64 on the raw kernel, both ways of forming the chunk
    weights (the factorised one and the exact L×L exponents used for extreme gates)."""
    if exact:
        monkeypatch.setattr(kernel_fwd, "_SPREAD", -1e9)
    xs = inputs(12, B=1, H=2, D=3, Dv=2, seed=3, dtype=torch.float64)
    if with_state:
        st = state0(B=1, H=2, D=3, Dv=2, dtype=torch.float64)
    else:
        f64 = torch.float64
        st = [
            torch.zeros(1, 2, 3, 2, dtype=f64),
            torch.zeros(1, 2, 3, dtype=f64),
            torch.full((1, 2), -math.inf, dtype=f64),
        ]
    leaves = [x.requires_grad_() for x in xs + (st if with_state else [])]

    def fn(*a):
        s = a[5:] if with_state else st
        h, (C, n, m) = mlstm_chunkwise(*a[:5], *s, 4, 3**-0.5, EPS)
        return h, C, n, m

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_native_saves_no_chunk_tiles():
    """The backward keeps inputs, h, den and per-chunk states, never an L×L tile per chunk."""
    T, L, D, Dv = 256, 64, 8, 8
    xs = [x.requires_grad_() for x in inputs(T, B=1, H=1, D=D, Dv=Dv)]
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h, _ = mlstm(*xs, chunk_size=L, backend="native")
    assert sizes and max(sizes) <= T * (Dv + 1), sizes  # (T / L) * L * L would be T * L
    h.sum().backward()


# --------------------------------------------------------------------------- Gated DeltaNet


@pytest.mark.parametrize("backend", GATED_DELTA_BACKENDS)
@pytest.mark.parametrize("T,chunk", [(1, 64), (7, 64), (100, 16), (200, 64)])
def test_gated_delta_backend_matches_float64_loop(backend, T, chunk):
    from tests.helpers import gated_delta_inputs

    q, k, v, g, beta, S0 = gated_delta_inputs(T, dk=D, dv=DV, seed=T)
    W = loss_weights((2, 2, T, DV), (2, 2, D, DV), seed=3)

    def op(*x):
        return list(gated_delta_rule(*x, True, chunk_size=chunk, backend=backend))

    leaves = [q, k, v, g, beta, S0]
    outs, gr = grads(op, leaves, W)

    def ref(*x, dtype):
        return list(naive_gated_delta(*x, dtype=dtype))

    floors, refs = noise_floor(ref, leaves)
    assert_within_noise(outs, floors, refs, ["o", "S"])
    gfloors, g_ref = grad_noise_floor(ref, leaves, W)
    assert_within_noise(gr, gfloors, g_ref, ["dq", "dk", "dv", "dg", "dbeta", "dS0"])


# --------------------------------------------------------------------------- torch.compile


def _compiled_matches_reference(fn, reference, xs):
    """fn (a scalar loss of an op) compiled with fullgraph, forward and backward, against
    ``reference(*xs, dtype)``, the same loss through the float64 loops, within float32 noise."""
    (out,), g = grads(lambda *x: [torch.compile(fn, fullgraph=True)(*x)], xs, [torch.ones(())])
    floors, refs = noise_floor(lambda *x, dtype: [reference(*x, dtype=dtype)], xs)
    assert_within_noise([out], floors, refs, ["loss"])
    gfloors, g_ref = grad_noise_floor(
        lambda *x, dtype: [reference(*x, dtype=dtype)], xs, [torch.ones((), dtype=torch.float64)]
    )
    assert_within_noise(g, gfloors, g_ref, [f"d{j}" for j in range(len(xs))])


def test_compile_mlstm_native():
    """The native kernel is a custom op with fake implementations: fullgraph compile works
    forward and backward."""
    xs = inputs(100, B=1, D=8, Dv=8)

    def fn(q, k, v, i, f):
        h, (C, n, m) = mlstm(q, k, v, i, f, chunk_size=16, output_final_state=True)
        return h.square().sum() + C.sum() + n.sum() + m.sum()

    def ref(q, k, v, i, f, dtype):
        h, (C, n, m) = naive_mlstm(q, k, v, i, f, dtype=dtype)
        return h.square().sum() + C.sum() + n.sum() + m.sum()

    _compiled_matches_reference(fn, ref, xs)


def test_compile_gated_delta_and_swa():
    q, k, v, i, f = inputs(100, B=1, D=8, Dv=8)
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)

    def gdn(q, k, v, g, beta):
        o, S = gated_delta_rule(
            q, k, v, -F.softplus(g), torch.sigmoid(beta), chunk_size=16, output_final_state=True
        )
        return o.square().sum() + S.sum()

    def gdn_ref(q, k, v, g, beta, dtype):
        o, S = naive_gated_delta(q, k, v, -F.softplus(g), torch.sigmoid(beta), dtype=dtype)
        return o.square().sum() + S.sum()

    _compiled_matches_reference(gdn, gdn_ref, [qn, kn, v, i, f])

    def swa(q, k, v):
        return sliding_window_attention(q, k, v, 24).square().sum()

    def swa_ref(q, k, v, dtype):
        return naive_swa(q, k, v, 24, dtype=dtype).square().sum()

    _compiled_matches_reference(swa, swa_ref, [q, k, v])


# --------------------------------------------------------------------------- benchmark smoke


@pytest.mark.slow
@pytest.mark.parametrize(
    "script,args,expect",
    [
        (
            "train_speed.py",
            [
                "--presets",
                "tiny",
                "--patterns",
                "SX",
                "A",
                "--seq",
                "256",
                "512",
                "--tokens-per-step",
                "1024",
                "--steps",
                "1",
            ],
            "acceptance (issue 5): tiny SX",
        ),
        (
            "decode.py",
            ["--patterns", "SX", "A", "--contexts", "256", "2048", "--steps", "4", "--rounds", "2"],
            "SX: 2,048 vs 256 context",
        ),
    ],
)
def test_benchmark_scripts_run(tmp_path, script, args, expect):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out.csv"
    r = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args, "--csv", str(out)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert expect in r.stdout, r.stdout
    assert out.exists() and out.with_suffix(".png").exists()


# --------------------------------------------------------------------------- Triton mLSTM gradient


def _stand_in_loop(q, k, v, i, f, C, n, m, eps):
    """The kernel's forward as a loop: h (gradient at constant denominator and m), and each
    step's ``max(|nᵀq̃|, exp(-m))`` and m (m floored at -10, as the kernel's is)."""
    Dqk = q.shape[-1]
    C, n, m = C.float(), n.float(), m.float()
    hs, dens, ms = [], [], []
    for t in range(q.shape[2]):
        logf = F.logsigmoid(f[:, :, t])
        m_new = torch.maximum(logf + m, i[:, :, t]).clamp_min(-10.0).detach()
        fp = torch.exp(logf + m - m_new)
        ip = torch.exp(i[:, :, t] - m_new)
        kt, vt = k[:, :, t].float(), v[:, :, t].float()
        C = fp[..., None, None] * C + ip[..., None, None] * (kt[..., :, None] * vt[..., None, :])
        n = fp[..., None] * n + ip[..., None] * kt
        m = m_new
        qt = q[:, :, t].float() * Dqk**-0.5
        den = torch.maximum((n * qt).sum(-1).abs(), torch.exp(-m))
        hs.append((qt[..., :, None] * C).sum(-2) / (den + eps).detach()[..., None])
        dens.append(den.detach())
        ms.append(m)
    return torch.stack(hs, 2).to(q.dtype), torch.stack(dens, 2), torch.stack(ms, 2)


def _kernel_stand_in(q, k, v, i, f, c_initial, n_initial, m_initial, eps, chunk_size):
    """What mlstm_kernels' ``chunkwise--triton_xl_chunk`` computes, in plain autograd: the
    same forward (state from ``m_initial``, 0 for the empty state) and its backward, which is
    the gradient with the denominator and the stabiliser m held constant. (Checked against
    the kernel itself, run by Triton's interpreter, to ~1e-6: benchmarks/mlstm_triton_grad.py.)"""
    return _stand_in_loop(q, k, v, i, f, c_initial, n_initial, m_initial[..., 0], eps)[0]


def _stats_stand_in(
    matQ, matK, matV, vecI, vecF, matC_initial, vecN_initial, scaM_initial, eps, **_
):
    """mlstm_kernels' forward function: (h, denominator without eps, m, None, None)."""
    h, den, m = _stand_in_loop(
        matQ, matK, matV, vecI, vecF, matC_initial, vecN_initial, scaM_initial[..., 0], eps
    )
    return h, den, m, None, None


def _kink_distance(xs, state) -> float:
    """min over steps of | |n·q̃| / exp(-m) - 1 | along the float64 cell loop."""
    q, k, v, i, f = (x.double() for x in xs)
    C, n, m = (x.double() for x in state)
    worst = math.inf
    for t in range(q.shape[2]):
        logf = F.logsigmoid(f[:, :, t])
        m_new = torch.maximum(logf + m, i[:, :, t])
        n = (
            torch.exp(logf + m - m_new)[..., None] * n
            + torch.exp(i[:, :, t] - m_new)[..., None] * k[:, :, t]
        )
        m = m_new
        nq = (n * q[:, :, t]).sum(-1) * q.shape[-1] ** -0.5
        worst = min(worst, (nq.abs() * torch.exp(m) - 1).abs().min().item())
    return worst


@pytest.mark.parametrize("stats", ["kernel-stats", "ones-call"])
@pytest.mark.parametrize("case", ["empty", "state", "eps-scale"])
@pytest.mark.parametrize("T", [20, 64, 100])
def test_triton_mlstm_gradient_is_the_cells(T, case, stats):
    """The Triton backend's gradient correction: with a kernel whose backward holds the
    denominator and the stabiliser constant (as mlstm_kernels' does), h and every input's
    gradient match the float64 cell loop (in the kernel's state convention, m0 = 0 for the
    empty state) to within float32 noise, at lengths the kernel needs padded (20, 100) and
    not (64); in "eps-scale" (input gates near 16, tiny queries) the denominator is of the
    order of eps, so the gradient through m matters. The side of the denominator's max is read
    from the kernel's forward statistics or, where those cannot be imported, from an eps = 0
    call on the ones column. Without the correction the check fails."""
    mod = sys.modules["swax.ops.mlstm.triton"]
    Dv = 32
    xs = inputs(T, Dv=Dv, seed=3)
    if case == "eps-scale":
        xs[0], xs[3] = xs[0] * 1e-5, xs[3] + 16
    if case == "state":
        C0, n0, m0 = state0(Dv=Dv, seed=4)
    else:
        C0, n0, m0 = torch.zeros(2, 2, D, Dv), torch.zeros(2, 2, D), torch.zeros(2, 2)
    (w,) = loss_weights((2, 2, T, Dv), seed=5)

    def ref(q, k, v, i, f, dtype=torch.float64):
        return [naive_mlstm(q, k, v, i, f, (C0, n0, m0), eps=EPS, dtype=dtype)[0]]

    # the data keeps away from the kink of max(|n·q̃|, exp(-m)), where the two one-sided
    # gradients differ and the backend reads the side to within a tolerance
    tol = mod._on_n_tolerance(torch.device("cpu"))
    assert _kink_distance(xs, (C0, n0, m0)) > 4 * tol, "test data too close to the kink"
    floors, g_ref = grad_noise_floor(ref, xs, [w])
    hfloor, (h_ref,) = noise_floor(ref, xs)

    def corrected(q, k, v, i, f):
        st = (C0, n0, m0)
        fw = _stats_stand_in if stats == "kernel-stats" else None
        return [mod._triton_with_true_grad(_kernel_stand_in, q, k, v, i, f, st, m0, EPS, fw)]

    (h,), g = grads(corrected, xs, [w])
    assert_within_noise([h], hfloor, [h_ref], ["h"])
    assert_within_noise(g, floors, g_ref, ["dq", "dk", "dv", "di", "df"])
    # the check has power: the kernel's own gradient is far off in q, k and the gates
    _, g_raw = grads(lambda *a: [_kernel_stand_in(*a, C0, n0, m0[..., None], EPS, 64)], xs, [w])
    assert all(
        rel_err(g_raw[j], g_ref[j]) > 100 * NOISE_FACTOR * floors[j] for j in (0, 1, 3, 4)
    ), [rel_err(g_raw[j], g_ref[j]) for j in range(5)]
