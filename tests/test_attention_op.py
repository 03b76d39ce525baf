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
from helpers import (
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

from swax.ops import available_backends, list_backends, select_backend, sliding_window_attention

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


def test_registry_names_and_fallback(caplog):
    assert {"blockwise", "reference", "flash", "flex"} <= set(list_backends("swa"))
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="'nope'"):
        select_backend("swa", "nope", q, q, q, 2)
    # flash needs CUDA: on the CPU it falls back, and says so in the log
    if not torch.cuda.is_available():
        with caplog.at_level("WARNING", logger="swax"):
            b = select_backend("swa", "flash", q, q, q, 2)
        assert b.name == "blockwise"
        assert "flash" in caplog.text and "unavailable" in caplog.text


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

    from swax.ops import attention

    try:  # plain torch, not swax: inductor's CPU flex template needs a vector ISA
        x = torch.zeros(1, 1, 128, 16)
        torch.compile(flex.flex_attention)(x, x, x)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"flex attention does not compile on this CPU: {str(e).splitlines()[0]}")
    torch._dynamo.reset()
    attention._compiled_flex.cache_clear()
    attention._flex_block_mask.cache_clear()
    before = counters["stats"]["unique_graphs"]
    W = 48
    shapes = [(100, 100, W), (64, 64, 32)]  # no cache: one class
    shapes += [(16, 16 + c, W) for c in range(8, W + 16, 8)] + [(40, 200, W), (7, 60, 32)]
    for i, (tq, tk, window) in enumerate(shapes):
        q, k, v = _inputs(1, 4, 2, tq, tk, 16, 16, torch.float32, seed=i)
        with torch.no_grad():
            out = attention._flex(q, k, v, window, 16**-0.5)
        (floor,), (ref,) = noise_floor(
            lambda q, k, v, dtype, w=window: [naive_swa(q, k, v, w, dtype=dtype)], [q, k, v]
        )
        assert_within_noise([out], [floor], [ref], [f"flex Tq={tq} Tk={tk} W={window}"])
    compiled = counters["stats"]["unique_graphs"] - before
    assert compiled <= 2, f"{compiled} compilations for {len(shapes)} shapes"
