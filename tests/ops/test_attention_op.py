"""sliding_window_attention (every backend usable here) against a naive float64 reference.

Tolerances come from the precision (tests/helpers.py): float32 results within NOISE_FACTOR
times the error float32 rounding alone makes on the same inputs (the naive loop run in float32;
the float64 loop on inputs perturbed by one rounding), bfloat16 results within 4 bfloat16 unit
roundoffs (their own rounding is one), RoPE within 8 float32 unit roundoffs (a rotation rounds
each value a few times; observed 1.3)."""

import math
import subprocess
import sys

import pytest
import torch

from swax.ops import available_backends, list_backends, select_backend, sliding_window_attention
from tests.helpers import (
    NOISE_FACTOR,
    U16,
    U32,
    assert_close,
    assert_within_noise,
    grad_noise_floor,
    grads,
    naive_swa,
    noise_floor,
    swa_inputs,
)

BF16_TOL = 4 * U16


def _inputs(B, Hq, Hkv, Tq, Tk, D, Dv, dtype, seed=0):
    return swa_inputs(B, Hq, Hkv, Tq, Tk, D, Dv, dtype, seed)


def _floors(q, k, v, window, do=None, scale=None):
    """(noise floor of o, float64 o) and, with an output gradient ``do``, (floors of dq, dk,
    dv, float64 gradients), of the naive loop on these inputs."""

    def ref(q, k, v, dtype):
        return [naive_swa(q, k, v, window, scale=scale, dtype=dtype)]

    xs = [t.detach() for t in (q, k, v)]
    fwd = noise_floor(ref, xs)
    return fwd if do is None else (fwd, grad_noise_floor(ref, xs, [do.double()]))


CASES = [  # (Tq, Tk, window)
    (1, 1, 1),
    (7, 7, 3),  # T < block
    (64, 64, 1),  # window 1: each query sees only itself
    (100, 100, 16),  # T not a multiple of the block
    (300, 300, 64),  # T > window, several blocks
    (300, 300, 100),  # window not a power of two
    (50, 50, 50),  # window == T: full causal
    (40, 40, 1000),  # window > T: full causal
    (33, 33, None),  # full causal
    (1, 90, 20),  # decode: one query against a cache
    (25, 90, 20),  # chunked prefill against a cache
    (25, 90, None),
]


@pytest.mark.parametrize(
    "backend", available_backends("swa", *_inputs(1, 2, 1, 4, 4, 8, 8, torch.float32), 4)
)
@pytest.mark.parametrize("tq,tk,window", CASES)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
def test_swa_matches_naive_float32(backend, tq, tk, window, hq, hkv):
    q, k, v = _inputs(2, hq, hkv, tq, tk, 16, 12, torch.float32, seed=tq * 7 + tk)
    do = torch.randn(2, hq, tq, 12, generator=torch.Generator().manual_seed(1))
    (o,), g = grads(
        lambda *x: [sliding_window_attention(*x, window, backend=backend)], [q, k, v], [do.double()]
    )
    (floors, refs), (gfloors, g_ref) = _floors(q, k, v, window, do)
    assert_within_noise([o], floors, refs, [f"o ({backend})"])
    assert_within_noise(g, gfloors, g_ref, ["dq", "dk", "dv"])


@pytest.mark.parametrize("tq,tk,window", [(100, 100, 16), (300, 300, 64), (25, 90, 20)])
def test_swa_bfloat16(tq, tk, window):
    q, k, v = _inputs(1, 4, 2, tq, tk, 32, 32, torch.bfloat16, seed=3)
    do = torch.randn(1, 4, tq, 32, generator=torch.Generator().manual_seed(2)).bfloat16()
    (o,), g = grads(lambda *x: [sliding_window_attention(*x, window)], [q, k, v], [do.double()])
    assert o.dtype == torch.bfloat16
    ref = lambda *x: [naive_swa(*x, window)]  # noqa: E731
    (o_ref,), g_ref = grads(ref, [t.detach().double() for t in (q, k, v)], [do.double()])
    assert_close(o, o_ref, BF16_TOL, "o")
    for name, a, b in zip(("dq", "dk", "dv"), g, g_ref):
        assert_close(a, b, BF16_TOL, name)


def test_window_at_least_T_equals_full_causal():
    q, k, v = (t.detach() for t in _inputs(1, 2, 2, 120, 120, 16, 16, torch.float32))
    full = sliding_window_attention(q, k, v, None)
    floors, _ = _floors(q, k, v, None)
    for w in (120, 121, 5000):
        # two float32 results, each within the noise of the float64 reference
        same = sliding_window_attention(q, k, v, w)
        assert_within_noise([same], floors, [full], [f"window {w}"], 2 * NOISE_FACTOR)
    # and a window smaller than T really differs (the window is never ignored)
    assert (sliding_window_attention(q, k, v, 119) - full).abs().max() > 1e-3


def test_explicit_scale():
    q, k, v = (t.detach() for t in _inputs(1, 2, 2, 50, 50, 16, 16, torch.float32))
    o = sliding_window_attention(q, k, v, 10, scale=0.3)
    floors, refs = _floors(q, k, v, 10, scale=0.3)
    assert_within_noise([o], floors, refs, ["o"])


@pytest.mark.parametrize(
    "shapes,window,match",
    [
        (((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), 0, "window must be >= 1"),
        (((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), -3, "-3"),
        (((1, 2, 8, 16), (1, 2, 8, 8), (1, 2, 8, 16)), 4, "head dims differ"),
        (((1, 3, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), 4, "multiple of key/value heads"),
        (((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 7, 16)), 4, "k and v must agree"),
        (((1, 2, 9, 16), (1, 2, 8, 16), (1, 2, 8, 16)), 4, "at least as long"),
        (((2, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), 4, "batch sizes differ"),
        (((2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), 4, r"\(2, 8, 16\)"),
    ],
)
def test_bad_inputs(shapes, window, match):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        sliding_window_attention(q, k, v, window)


def test_window_type_errors():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="2.5"):
        sliding_window_attention(q, q, q, 2.5)
    with pytest.raises(ValueError, match="True"):
        sliding_window_attention(q, q, q, True)


def test_registry_names_and_fallback():
    assert {"blockwise", "reference", "flash", "flex"} <= set(list_backends("swa"))
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="'nope'"):
        select_backend("swa", "nope", q, q, q, 2)
    # flash needs CUDA: on the CPU naming it is an error saying so; auto falls back
    if not torch.cuda.is_available():
        from swax.ops.registry import BackendUnavailableError

        with pytest.raises(BackendUnavailableError) as e:
            select_backend("swa", "flash", q, q, q, 2)
        assert str(e.value) == (
            "swa backend 'flash' is not available: needs CUDA; use backend=auto to fall back"
        )
        b = select_backend("swa", "auto", q, q, q, 2)
        assert b.name == "blockwise_fwd"  # no gradient needed: the CPU's forward-only path
        # a forward-only backend named where a gradient is needed
        g = q.detach().requires_grad_()
        with pytest.raises(BackendUnavailableError, match="a gradient is needed"):
            sliding_window_attention(g, g, g, 2, backend="blockwise_fwd")


def test_blockwise_memory_is_linear_in_T():
    """T = 32768 with W = 64: a T×T float32 score matrix would be 4 GiB; peak RSS must stay
    far below that (run in a fresh process so the peak is this computation's)."""
    code = (
        "import resource, torch\n"
        "from swax.ops import sliding_window_attention as swa\n"
        "torch.set_num_threads(1)\n"
        "q = torch.randn(1, 1, 32768, 16)\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "with torch.no_grad():\n"
        "    o = swa(q, q, q, 64)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grew = int(out.stdout.strip())
    print(f"peak RSS growth {grew / 2**20:.1f} MiB (T×T would be {32768**2 * 4 / 2**30:.0f} GiB)")
    assert grew < 512 * 2**20


def test_rope_matches_complex_rotation_and_offset():
    from swax.ops import apply_rope

    x = torch.randn(2, 3, 20, 8, dtype=torch.float64).float()
    # independent reference: pairs (x_j, x_{j+D/2}) as complex numbers times e^{i·pos·θ_j}
    D = 8
    theta = [10000.0 ** (-2 * j / D) for j in range(D // 2)]
    for offset in (0, 5, 100_000):
        y = apply_rope(x, offset=offset)
        z = torch.complex(x[..., : D // 2].double(), x[..., D // 2 :].double())
        ang = torch.tensor(
            [[(offset + t) * th for th in theta] for t in range(20)], dtype=torch.float64
        )
        rot = z * torch.polar(torch.ones_like(ang), ang)
        ref = torch.cat([rot.real, rot.imag], dim=-1)
        assert_close(y, ref, 8 * U32, f"offset {offset}")
    # a slice rotated with its offset equals the same slice of the full rotation
    assert_close(apply_rope(x[:, :, 7:], offset=7), apply_rope(x)[:, :, 7:], 8 * U32, "slice")
    # the angle at position 100 000 is computed exactly (not accumulated in float32)
    y = apply_rope(torch.tensor([[[[1.0, 0.0]]]]), offset=100_000)
    assert abs(y[0, 0, 0, 0].item() - math.cos(100_000)) < 8 * U32


def test_flex_path_compiles_once_per_shape_class():
    """The flex backend (CUDA's default; its forward also compiles on the CPU) pads queries and
    keys to block-rounded lengths and passes the cache offset and the window as tensors: a run
    of chunked-prefill-like shapes (a growing cache, short last chunks, another window)
    compiles two kernels, not one per key length, and every output matches the float64
    reference within float32 noise."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from torch._dynamo.utils import counters

    from swax.ops.swa import flex as swa_flex

    try:  # plain torch, not swax: inductor's CPU flex template needs a vector ISA
        x = torch.zeros(1, 1, 128, 16)
        torch.compile(flex.flex_attention)(x, x, x)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"flex attention does not compile on this CPU: {str(e).splitlines()[0]}")
    torch._dynamo.reset()
    swa_flex._compiled_flex.cache_clear()
    swa_flex._flex_block_mask.cache_clear()
    before = counters["stats"]["unique_graphs"]
    W = 48
    shapes = [(100, 100, W), (64, 64, 32)]  # no cache: one class
    shapes += [(16, 16 + c, W) for c in range(8, W + 16, 8)] + [(40, 200, W), (7, 60, 32)]
    for i, (tq, tk, window) in enumerate(shapes):
        q, k, v = _inputs(1, 4, 2, tq, tk, 16, 16, torch.float32, seed=i)
        with torch.no_grad():
            out = swa_flex._flex(q, k, v, window, 16**-0.5)
        (floor,), (ref,) = noise_floor(
            lambda q, k, v, dtype, w=window: [naive_swa(q, k, v, w, dtype=dtype)], [q, k, v]
        )
        assert_within_noise([out], [floor], [ref], [f"flex Tq={tq} Tk={tk} W={window}"])
    compiled = counters["stats"]["unique_graphs"] - before
    assert compiled <= 2, f"{compiled} compilations for {len(shapes)} shapes"


# ------------------------------------------------------------------ the CPU's grad-free paths

FWD_CASES = CASES + [
    (257, 257, 32),  # whole blocks and a partial last one
    (64, 64, 63),  # window just below T
    (600, 600, 2048),  # window far above T (full causal)
    (900, 900, 800),  # long window: blocks of 64, many edge blocks
    (100, 400, 30),  # a long cache: no edge block
    (31, 31, 5),
]


@pytest.fixture(params=["one stream", "per head"])
def fwd_path(request, monkeypatch):
    """blockwise_fwd's two layouts, each for every case whatever its rule would take: all heads
    in one key stream (small calls) and head by head with padded edge blocks."""
    from swax.ops.swa import forward as swa_forward

    flat = request.param == "one stream"
    monkeypatch.setattr(swa_forward, "_flat_fits", lambda *a: flat)
    return request.param


@pytest.mark.parametrize("tq,tk,window", FWD_CASES)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 1)])
def test_blockwise_fwd_matches_naive_float32(tq, tk, window, hq, hkv, fwd_path):
    q, k, v = (t.detach() for t in _inputs(2, hq, hkv, tq, tk, 16, 12, torch.float32, seed=tq))
    with torch.no_grad():
        assert select_backend("swa", "blockwise_fwd", q, k, v, window).name == "blockwise_fwd"
        o = sliding_window_attention(q, k, v, window, backend="blockwise_fwd")
    floors, refs = _floors(q, k, v, window)
    assert_within_noise([o], floors, refs, [f"blockwise_fwd Tq={tq} Tk={tk} W={window}"])


def test_blockwise_fwd_edge_blocks_in_batch_slices(monkeypatch):
    """The first blocks (windows reaching left of key 0) and a last partial block go through one
    product over all heads; with a budget of one batch row per slice the result is the same."""
    from swax.ops.swa import forward as swa_forward

    monkeypatch.setattr(swa_forward, "_FWD_EDGE_BYTES", 1)
    monkeypatch.setattr(swa_forward, "_flat_fits", lambda *a: False)  # the per-head edge path
    q, k, v = (t.detach() for t in _inputs(3, 4, 2, 301, 301, 16, 12, torch.float32, seed=4))
    with torch.no_grad():
        o = sliding_window_attention(q, k, v, 70, backend="blockwise_fwd")
    floors, refs = _floors(q, k, v, 70)
    assert_within_noise([o], floors, refs, ["edges one batch row at a time"])


def test_blockwise_fwd_noncontiguous_and_bfloat16(fwd_path):
    """Inputs as the attention layer makes them ((B, T, H, D) transposed) and bfloat16 ones."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 300, 4, 16, generator=g).transpose(1, 2) for _ in range(3))
    with torch.no_grad():
        o = sliding_window_attention(q, k, v, 40, backend="blockwise_fwd")
    floors, refs = _floors(q, k, v, 40)
    assert_within_noise([o], floors, refs, ["non-contiguous"])
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    with torch.no_grad():
        ob = sliding_window_attention(qb, kb, vb, 40, backend="blockwise_fwd")
    assert ob.dtype == torch.bfloat16
    assert_close(ob, naive_swa(*(t.double() for t in (qb, kb, vb)), 40), BF16_TOL, "bfloat16")


def _flex_compiles_here() -> str | None:
    """None if compiled flex attention runs on this CPU, else why not."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    try:  # plain torch, not swax: inductor's CPU flex template needs a vector ISA
        x = torch.zeros(1, 1, 128, 16)
        torch.compile(flex.flex_attention)(x, x, x)
    except Exception as e:  # noqa: BLE001
        return str(e).splitlines()[0]
    return None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU dispatch")
def test_cpu_dispatch_by_gradient_window_and_length(monkeypatch):
    """auto on the CPU: the autograd path when a gradient is needed (or for doc_ids, or inside
    torch.compile); otherwise compiled flex for windows from 512 in calls of 256 queries or
    more, where it is usable and not turned off, and the forward-only kernel for the rest — on
    any number of threads."""
    from swax.ops import swa
    from swax.ops.registry import BackendUnavailableError
    from swax.ops.swa import flex as swa_flex

    monkeypatch.setattr(
        swa_flex, "_FLEX_CPU_STATE", {"failed": None, "shapes": set(), "announced": False}
    )
    monkeypatch.delenv("SWAX_CPU_FLEX", raising=False)

    def pick(tq, window, grad=False, no_grad=False, name=None, dtype=torch.float32, **kw):
        q, k, v = (torch.zeros(1, 2, tq, 8, dtype=dtype, requires_grad=grad) for _ in range(3))
        with torch.set_grad_enabled(not no_grad):
            return select_backend("swa", name, q, k, v, window, **kw).name

    def named(tq, window, **kw):
        """flex asked for by name: "flex", or the reason it cannot run (an error, no fallback)."""
        try:
            return pick(tq, window, name="flex", **kw)
        except BackendUnavailableError as e:
            return e.reason

    flex = "flex" if swa_flex._flex_cpu_template() is None else "blockwise_fwd"
    by_name = "flex" if flex == "flex" else swa_flex._flex_cpu_template()
    assert swa_flex.CPU_FLEX_MIN_WINDOW == 512 and swa_flex.CPU_FLEX_MIN_QUERIES == 256
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda n=threads: n)
        assert pick(1024, 128) == "blockwise_fwd"
        assert pick(65536, 256) == "blockwise_fwd"  # below 512: whatever the length
        assert pick(4096, 2048) == flex
        assert pick(256, 512) == flex  # the least that goes to flex: 256 queries, W = 512
        assert pick(255, 512) == "blockwise_fwd"  # one query fewer
        assert pick(4096, 511) == "blockwise_fwd"  # a window one short
        assert pick(1024, 2048) == flex  # the window covers the keys: a causal band in flex
        assert pick(1, 2048) == "blockwise_fwd"  # a decode step
        assert pick(4096, None) == "blockwise_fwd"  # full causal: fused SDPA inside
        assert pick(4096, 2048, dtype=torch.bfloat16) == "blockwise_fwd"  # flex: float32 only
    assert pick(1024, 128, grad=True) == "blockwise"
    assert pick(1024, 128, grad=True, no_grad=True) == "blockwise_fwd"
    assert pick(4096, 2048, grad=True, no_grad=True) == flex
    assert pick(1024, 128, doc_ids=torch.zeros(1, 1024, dtype=torch.long)) == "blockwise"
    assert pick(4096, 2048, grad=True) == "blockwise"
    assert named(1024, 128) == by_name  # by name: any window and size
    for off in ("0", "off", " False "):
        monkeypatch.setenv("SWAX_CPU_FLEX", off)
        assert pick(4096, 2048) == "blockwise_fwd"
        assert named(4096, 2048) == by_name  # by name it is still taken
    monkeypatch.setenv("SWAX_CPU_FLEX", "1")
    assert pick(4096, 2048) == flex
    with swa.cpu_flex(False):  # as in swax generate: off unless the env says 1
        assert pick(4096, 2048) == flex
        monkeypatch.delenv("SWAX_CPU_FLEX")
        assert pick(4096, 2048) == "blockwise_fwd"
        assert named(4096, 2048) == by_name
        with swa.cpu_flex(True):
            assert pick(4096, 2048) == flex
        assert not swa.cpu_flex_enabled()
        assert pick(4096, 2048) == "blockwise_fwd"
        monkeypatch.setenv("SWAX_CPU_FLEX", "off")
        assert pick(4096, 2048) == "blockwise_fwd"
        monkeypatch.delenv("SWAX_CPU_FLEX")
    assert pick(4096, 2048) == flex
    assert "backward is not implemented" in named(4096, 2048, grad=True)  # an error, no fallback
    failed = {"failed": "compiling it failed (test)", "shapes": set(), "announced": True}
    monkeypatch.setattr(swa_flex, "_FLEX_CPU_STATE", failed)
    assert pick(4096, 2048) == "blockwise_fwd"
    monkeypatch.setattr(
        swa_flex, "_FLEX_CPU_STATE", {"failed": None, "shapes": set(), "announced": True}
    )
    monkeypatch.setattr(swa_flex, "_flex_cpu_template", lambda: "no template (test)")
    assert pick(4096, 2048) == "blockwise_fwd"
    assert named(4096, 2048) == "no template (test)"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert pick(4096, 128) == "blockwise"
    assert pick(4096, 2048) == "blockwise"
    assert named(4096, 2048) == "on the CPU, not inside torch.compile"


def test_cpu_flex_compile_budget(monkeypatch):
    """Once torch._dynamo's recompile limit worth of kernels is compiled, a new shape leaves
    flex (which would otherwise run eagerly, with T×T scores); a shape run before stays."""
    from swax.ops.swa import flex as swa_flex

    monkeypatch.delenv("SWAX_CPU_FLEX", raising=False)
    budget = swa_flex._flex_cpu_budget()
    state = {"failed": None, "shapes": set(), "announced": True}
    monkeypatch.setattr(swa_flex, "_FLEX_CPU_STATE", state)
    monkeypatch.setattr(swa_flex, "_flex_cpu_template", lambda: None)
    compiled = {"n": budget - 1}
    monkeypatch.setattr(swa_flex, "_flex_cpu_compiled", lambda: compiled["n"])
    q = torch.zeros(1, 2, 4096, 8)
    assert swa_flex._flex_usable(q, q, q, 2048) is None
    assert select_backend("swa", None, q, q, q, 2048).name == "flex"
    compiled["n"] = budget
    assert "recompile limit" in swa_flex._flex_usable(q, q, q, 2048)
    assert select_backend("swa", None, q, q, q, 2048).name == "blockwise_fwd"
    state["shapes"].add(swa_flex._flex_shape_key(q, q, q, 2048))  # a shape compiled already
    assert swa_flex._flex_usable(q, q, q, 2048) is None


def test_cpu_flex_falls_back_when_compile_fails(monkeypatch, caplog):
    """A compile error in the flex path: a warning naming both backends, the right output from
    the next backend, and flex unusable from then on."""
    from swax.ops.swa import flex as swa_flex

    def broken(*a, **kw):
        raise RuntimeError("InductorError: no working C++ compiler (test)")

    state = {"failed": None, "shapes": set(), "announced": False}
    monkeypatch.setattr(swa_flex, "_FLEX_CPU_STATE", state)
    monkeypatch.setattr(swa_flex, "_flex_cpu_template", lambda: None)
    monkeypatch.setattr(swa_flex, "_compiled_flex", lambda *a, **kw: broken)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    q, k, v = (t.detach() for t in _inputs(1, 2, 2, 600, 600, 16, 16, torch.float32, seed=9))
    with torch.no_grad():
        assert select_backend("swa", "flex", q, k, v, 512).name == "flex"
        with caplog.at_level("WARNING", logger="swax"):
            o = sliding_window_attention(q, k, v, 512, backend="flex")
        assert "'flex' unavailable" in caplog.text and "'blockwise_fwd'" in caplog.text
        assert "C++ compiler" in caplog.text
        assert swa_flex._flex_usable(q, k, v, 512).startswith("compiling it failed")
    floors, refs = _floors(q, k, v, 512)
    assert_within_noise([o], floors, refs, ["after the fallback"])


@pytest.mark.parametrize("tq,tk,window", [(300, 300, 100), (200, 700, 256), (129, 1000, 64)])
def test_flex_band_blocks_match_dense_mask(tq, tk, window):
    """The block mask built from the blocks' corners classifies every (query block, key block)
    pair as the dense T×T band does: no pair seen, some, or all."""
    from swax.ops.swa import flex as swa_flex

    _, tq_p, tk_p = swa_flex._flex_shapes(tq, tk, window)
    blk = swa_flex._FLEX_BLOCK
    partial, full = swa_flex._band_blocks(tq_p // blk, tk_p // blk, tk - tq, window, "cpu")
    qi = torch.arange(tq_p)[:, None] + (tk - tq)
    ki = torch.arange(tk_p)[None, :]
    dense = (ki <= qi) & (qi - ki < window)
    per = dense.view(tq_p // blk, blk, tk_p // blk, blk).sum((1, 3))
    assert torch.equal(full, per == blk * blk)
    assert torch.equal(partial, (per > 0) & (per < blk * blk))


def test_cpu_flex_dispatch_matches_naive(monkeypatch):
    """Compiled flex on the CPU, asked for by name, for a long window without gradient: its
    output equals the float64 reference within float32 noise (padded lengths, GQA, a cache),
    and neither new lengths nor another memory layout compile again."""
    from swax.ops.swa import flex as swa_flex

    reason = _flex_compiles_here()
    if reason:
        pytest.skip(f"flex attention does not compile on this CPU: {reason}")
    torch._dynamo.reset()
    monkeypatch.setattr(
        swa_flex, "_FLEX_CPU_STATE", {"failed": None, "shapes": set(), "announced": False}
    )

    def run(tq, tk, hkv):
        q, k, v = (t.detach() for t in _inputs(1, 2, hkv, tq, tk, 16, 16, torch.float32))
        with torch.no_grad():
            why = swa_flex._flex_usable(q, k, v, 512)
            assert select_backend("swa", "flex", q, k, v, 512).name == "flex", why
            o = sliding_window_attention(q, k, v, 512, backend="flex")
        floors, refs = _floors(q, k, v, 512)
        assert_within_noise([o], floors, refs, [f"flex on the CPU Tq={tq} Tk={tk}"])

    for tq, tk, hkv in ((600, 600, 2), (520, 1300, 1), (700, 700, 2), (390, 1100, 1)):
        run(tq, tk, hkv)
    compiled = swa_flex._flex_cpu_compiled()
    assert 0 < compiled <= 4
    for tq, tk, hkv in ((830, 830, 2), (450, 1200, 1)):  # new lengths: symbolic, no compile
        run(tq, tk, hkv)
    assert swa_flex._flex_cpu_compiled() == compiled
    # the attention layer's (B, T, H, D) views, transposed (896: no padding copies them)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 896, 2, 16, generator=g).transpose(1, 2) for _ in range(3))
    with torch.no_grad():
        o = sliding_window_attention(q, k, v, 512, backend="flex")
    floors, refs = _floors(q, k, v, 512)
    assert_within_noise([o], floors, refs, ["flex on the CPU, transposed inputs"])
    assert swa_flex._flex_cpu_compiled() == compiled


@pytest.mark.slow
def test_long_window_prefill_through_cpu_flex_matches_float64_model(monkeypatch):
    """A model with W=2048 prefilled in chunks of 2048 (the chunks after the first attend to a
    cache) takes compiled flex under "auto" on the CPU; its last logits are as close to the same
    model run in float64 with the naive reference attention as the float32 blockwise_fwd path
    is (twice that error, plus float32's floor, bounds it)."""
    from swax import SwaxConfig, SwaxLM
    from swax.generate import prefill
    from swax.ops.registry import forced_backends
    from swax.ops.swa import flex as swa_flex
    from tests.helpers import FLOOR, rel_err

    reason = _flex_compiles_here()
    if reason:
        pytest.skip(f"flex attention does not compile on this CPU: {reason}")
    monkeypatch.delenv("SWAX_CPU_FLEX", raising=False)
    torch.manual_seed(0)
    cfg = SwaxConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=64, window=2048)
    model = SwaxLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 6144))
    before = len(swa_flex._FLEX_CPU_STATE["shapes"])
    with torch.no_grad():
        auto, _ = prefill(model, ids, chunk_size=2048)
        assert len(swa_flex._FLEX_CPU_STATE["shapes"]) > before, "flex was not taken"
        with forced_backends(swa="blockwise_fwd"):
            peer, _ = prefill(model, ids, chunk_size=2048)
        with forced_backends(swa="reference"):
            exact = model.double()(ids, window=2048)[:, -1]
    err_peer = rel_err(peer.double(), exact)
    assert rel_err(auto.double(), exact) <= 2 * err_peer + FLOOR


def test_blockwise_fwd_layout_rule():
    """Which calls take the one-stream layout: a few thousand query rows over all heads, a
    window whose lead rounds up by at most a quarter block, and at least as many real slots
    as padding ones (by hand: W=128 has blocks of 16 and a lead of 8 blocks)."""
    from swax.ops.swa.forward import _FWD_FLAT_ROWS, _flat_fits, _fwd_block

    assert _fwd_block(128) == 16 and _fwd_block(511) == 63
    assert _flat_fits(4, 1024, 128, 16)
    assert _flat_fits(4, _FWD_FLAT_ROWS // 4 - 128, 128, 16)
    assert not _flat_fits(4, _FWD_FLAT_ROWS // 4 - 127, 128, 16)  # one row too many
    assert _flat_fits(4, 113, 128, 16) and not _flat_fits(4, 112, 128, 16)  # 8 slots vs 8 / 7
    assert not _flat_fits(4, 1024, 511, 63)  # lead 567 for W - 1 = 510: 57 rows more
    assert _flat_fits(4, 1024, 97, 16) and not _flat_fits(4, 1024, 100, 16)  # 96 → 96, 99 → 112


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(
    "tq,tk,window,hq,hkv",
    [
        (100, 100, 16, 4, 4),  # padded to one block of 128
        (200, 200, 40, 4, 2),  # two blocks, grouped-query heads
        (160, 160, 150, 2, 1),  # the band crosses a block boundary, one key/value head
        (25, 90, 20, 4, 2),  # chunked prefill: queries at the end of a cache, keys dropped
        (130, 200, 129, 2, 1),  # keys padded beyond the queries' blocks
    ],
)
def test_flex_cuda_branch_matches_naive_with_gradients(tq, tk, window, hq, hkv, monkeypatch):
    """flex's CUDA branch (dropping the keys no query sees, padding to blocks, the block mask,
    GQA, the output's slice: swax.ops.swa.flex._flex_banded) around eager flex_attention on
    the CPU, forward and backward, against the float64 loop (on CUDA it wraps the compiled
    call, which the gpu tier checks). torch refuses gradients through flex on the CPU by a
    device check only; its eager path (the math of flex's reference implementation) runs them."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from swax.ops.swa.flex import _flex_banded

    if not hasattr(flex, "_validate_device"):
        pytest.skip("this torch has no flex device check to lift")
    monkeypatch.setattr(flex, "_validate_device", lambda *a: None)

    q, k, v = _inputs(2, hq, hkv, tq, tk, 16, 12, torch.float32, seed=tq + tk + window)
    do = torch.randn(2, hq, tq, 12, generator=torch.Generator().manual_seed(2))
    scale = 16**-0.5
    (o,), g = grads(
        lambda *x: [_flex_banded(*x, window, scale, flex.flex_attention)], [q, k, v], [do.double()]
    )
    (floors, refs), (gfloors, g_ref) = _floors(q, k, v, window, do)
    assert_within_noise([o], floors, refs, ["o (flex, CUDA branch)"])
    assert_within_noise(g, gfloors, g_ref, ["dq", "dk", "dv"])
