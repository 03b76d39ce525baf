"""Op backends: the registry, the native mLSTM kernel with its hand-written backward, and
torch.compile of every op.

References are independent of the code under test: a float64 per-step loop written here from
the cell equations, the chunkwise form under plain autograd (``backend="autograd"``, a
separate implementation), and ``torch.autograd.gradcheck`` (finite differences) in float64.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import swax.ops._mlstm_chunkwise as kernel
from swax.ops import (
    available_backends,
    gated_delta_rule,
    list_backends,
    mlstm,
    select_backend,
    sliding_window_attention,
)
from swax.ops._mlstm_chunkwise import mlstm_chunkwise

EPS = 1e-6


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


from test_mlstm_op import naive_mlstm  # noqa: E402  (the float64 loop over time)


def inputs(T, B=2, H=2, D=8, Dv=12, seed=0, dtype=torch.float32, f_shift=2.0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D, generator=g) for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=g)
    i = 2 * torch.randn(B, H, T, generator=g)
    f = torch.randn(B, H, T, generator=g) + f_shift
    return [x.to(dtype) for x in (q, k, v, i, f)]


def state0(B=2, H=2, D=8, Dv=12, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [
        (0.3 * torch.randn(B, H, D, Dv, generator=g)).to(dtype),
        (0.3 * torch.randn(B, H, D, generator=g)).to(dtype),
        torch.randn(B, H, generator=g).to(dtype),
    ]


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def run_with_grads(fn, xs, st, weights):
    """h, final state and the gradients of sum(weights · (h, C, n, m)) w.r.t. xs and st."""
    xs = [x.detach().clone().requires_grad_() for x in xs]
    st = None if st is None else [s.detach().clone().requires_grad_() for s in st]
    h, (C, n, m) = fn(xs, st)
    loss = sum((o.double() * w).sum() for o, w in zip((h, C, n, m), weights))
    leaves = xs + (st or [])
    grads = torch.autograd.grad(loss, leaves)
    return (h, C, n, m), grads


def loss_weights(T, B=2, H=2, D=8, Dv=12, seed=7):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64),
        torch.randn(B, H, D, Dv, generator=g, dtype=torch.float64),
        torch.randn(B, H, D, generator=g, dtype=torch.float64),
        torch.randn(B, H, generator=g, dtype=torch.float64),
    ]


# --------------------------------------------------------------------------- registry


def test_backend_names_and_priorities():
    assert list_backends("mlstm") == ["triton", "native", "autograd"]
    assert list_backends("gated_delta") == ["fla", "native"]
    assert list_backends("swa")[0] == "flash"
    q, k, v, i, f = inputs(20)
    assert select_backend("mlstm", None, q, k, v, i, f).name == (
        "triton" if "triton" in available_backends("mlstm", q, k, v, i, f) else "native"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_gpu_backends_fall_back_on_cpu_and_say_so(caplog):
    q, k, v, i, f = inputs(20)
    with caplog.at_level("WARNING", logger="swax"):
        h, _ = mlstm(q, k, v, i, f, backend="triton")
    assert "triton" in caplog.text and "unavailable" in caplog.text and "'native'" in caplog.text
    torch.testing.assert_close(h, mlstm(q, k, v, i, f, backend="native")[0], rtol=0, atol=0)
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    g, beta = -F.softplus(i), torch.sigmoid(f)
    caplog.clear()
    with caplog.at_level("WARNING", logger="swax"):
        o, _ = gated_delta_rule(qn, kn, v, g, beta, backend="fla")
    assert "fla" in caplog.text and "unavailable" in caplog.text
    torch.testing.assert_close(
        o, gated_delta_rule(qn, kn, v, g, beta, backend="native")[0], rtol=0, atol=0
    )


def test_unknown_backend_is_an_error_naming_the_choices():
    q, k, v, i, f = inputs(5)
    for mode in ("chunk", "parallel"):
        with pytest.raises(ValueError, match="'nope'") as e:
            mlstm(q, k, v, i, f, mode=mode, backend="nope")
        assert "native" in str(e.value)
    with pytest.raises(ValueError, match="'nope'"):
        gated_delta_rule(q, k, v, -F.softplus(i), torch.sigmoid(f), backend="nope")


# --------------------------------------------------------------------------- native mLSTM


@pytest.mark.parametrize("T,chunk", [(1, 64), (7, 64), (64, 16), (100, 16), (100, 64), (200, 32)])
@pytest.mark.parametrize("with_state", [False, True], ids=["empty", "state"])
def test_native_matches_autograd_path_and_float64_loop(T, chunk, with_state):
    """Forward, final state and every gradient (inputs, initial state) of the native kernel
    against the autograd chunk path (float32) and the float64 per-step loop."""
    xs = inputs(T, seed=T)
    st = state0() if with_state else None
    W = loss_weights(T)

    def op(backend):
        return lambda a, s: mlstm(
            *a,
            initial_state=None if s is None else tuple(s),
            output_final_state=True,
            chunk_size=chunk,
            backend=backend,
        )

    out_n, g_n = run_with_grads(op("native"), xs, st, W)
    out_a, g_a = run_with_grads(op("autograd"), xs, st, W)
    x64 = [x.double() for x in xs]
    s64 = None if st is None else [s.double() for s in st]
    out_r, g_r = run_with_grads(lambda a, s: naive_mlstm(*a, state=s), x64, s64, W)
    names = ["q", "k", "v", "i", "f", "C0", "n0", "m0"]
    for name, a, b, r in zip(["h", "C", "n", "m"], out_n, out_a, out_r):
        assert rel(a, r) < 2e-5, (name, rel(a, r))
        assert rel(a, b) < 2e-5, (name, rel(a, b))
    for name, a, b, r in zip(names, g_n, g_a, g_r):
        assert torch.isfinite(a).all(), name
        assert rel(a, r) < 1e-4, (f"d{name} vs float64 loop", rel(a, r))
        assert rel(a, b) < 1e-4, (f"d{name} vs autograd path", rel(a, b))


@pytest.mark.parametrize("exact", [False, True], ids=["factorised", "exact"])
@pytest.mark.parametrize("with_state", [False, True], ids=["empty", "state"])
def test_kernel_gradcheck_float64(exact, with_state, monkeypatch):
    """Finite differences in float64 on the raw kernel, both ways of forming the chunk
    weights (the factorised one and the exact L×L exponents used for extreme gates)."""
    if exact:
        monkeypatch.setattr(kernel, "_SPREAD", -1e9)
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


@pytest.mark.parametrize("case", ["closing_forget_gates", "i_pm15", "large_state_m"])
def test_native_extreme_gates(case):
    """Gates that make chunks take the exact path (or stress the stabiliser): finite, and
    equal to the float64 loop, forward and backward."""
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
    W = loss_weights(T)
    fn = lambda backend: (
        lambda a, s: mlstm(  # noqa: E731
            *a,
            initial_state=None if s is None else tuple(s),
            output_final_state=True,
            chunk_size=32,
            backend=backend,
        )
    )
    out_n, g_n = run_with_grads(fn("native"), [q, k, v, i, f], st, W)
    s64 = None if st is None else [s.double() for s in st]
    out_r, g_r = run_with_grads(
        lambda a, s: naive_mlstm(*a, state=s), [x.double() for x in (q, k, v, i, f)], s64, W
    )
    for name, a, r in zip("hCnm", out_n, out_r):
        assert rel(a, r) < 1e-4, (name, rel(a, r))
    for name, a, r in zip(["q", "k", "v", "i", "f", "C0", "n0", "m0"], g_n, g_r):
        assert torch.isfinite(a).all(), name
        assert rel(a, r) < 1e-3, (f"d{name}", rel(a, r))


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


# --------------------------------------------------------------------------- torch.compile


def _compiled_matches_eager(fn, xs):
    a = [x.clone().requires_grad_() for x in xs]
    b = [x.clone().requires_grad_() for x in xs]
    out_c = torch.compile(fn, fullgraph=True)(*a)
    out_c.backward()
    out_e = fn(*b)
    out_e.backward()
    assert rel(out_c, out_e) < 1e-5
    for x, y in zip(a, b):
        assert rel(x.grad, y.grad) < 1e-4


def test_compile_mlstm_native():
    """The native kernel is a custom op with fake implementations: fullgraph compile works
    forward and backward, and agrees with eager."""
    xs = inputs(100, B=1, D=8, Dv=8)

    def fn(q, k, v, i, f):
        h, (C, n, m) = mlstm(q, k, v, i, f, chunk_size=16, output_final_state=True)
        return h.square().sum() + C.sum() + n.sum() + m.sum()

    _compiled_matches_eager(fn, xs)


def test_compile_gated_delta_and_swa():
    q, k, v, i, f = inputs(100, B=1, D=8, Dv=8)
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)

    def gdn(q, k, v, g, beta):
        o, S = gated_delta_rule(
            q, k, v, -F.softplus(g), torch.sigmoid(beta), chunk_size=16, output_final_state=True
        )
        return o.square().sum() + S.sum()

    _compiled_matches_eager(gdn, [qn, kn, v, i, f])

    def swa(q, k, v):
        return sliding_window_attention(q, k, v, 24).square().sum()

    _compiled_matches_eager(swa, [q, k, v])


# --------------------------------------------------------------------------- benchmark smoke


@pytest.mark.slow
@pytest.mark.parametrize(
    "script,args,expect",
    [
        (
            "model.py",
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

    root = Path(__file__).resolve().parents[1]
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
