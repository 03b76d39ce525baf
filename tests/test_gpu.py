"""GPU paths against float64 references (marker `gpu`; skipped without CUDA).

Tolerances come from the precision each path uses (tests/helpers.py): an output or gradient is
within NOISE_FACTOR times the error that rounding its inputs at the path's unit roundoff causes
on the same inputs — float32 for cuBLAS and flex attention at torch's default matmul precision
("highest": IEEE float32), TF32 (2^-11) for Triton kernels that feed float32 tiles to
``tl.dot`` (mlstm_kernels, fla), bfloat16 (2^-8) for bfloat16 inputs. A failure prints the
backend, the quantity and both numbers.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    FLOOR,
    NOISE_FACTOR,
    U16,
    U32,
    UTF32,
    grad_noise_floor,
    grads,
    naive_gated_delta,
    naive_mlstm,
    naive_swa,
    noise_floor,
    rel_err,
    swa_inputs,
)

from swax import SwaxConfig, SwaxLM
from swax.ops import (
    available_backends,
    gated_delta_rule,
    mlstm,
    select_backend,
    sliding_window_attention,
)

pytestmark = pytest.mark.gpu

EPS = 1e-6


def _float32_unit() -> float:
    """cuBLAS and flex attention round float32 matmuls to TF32 unless the precision is
    'highest' (torch's default)."""
    return U32 if torch.get_float32_matmul_precision() == "highest" else UTF32


def _within(got, floors, refs, names, unit_out):
    """Each result within NOISE_FACTOR x its noise floor, plus two roundings of the dtype it
    is returned in (a bfloat16 result carries its own rounding, which no input perturbation
    shows: dv = do when one key is visible)."""
    scale = max((r.abs().max().item() for r in refs), default=0.0)
    for a, floor, r, name in zip(got, floors, refs, names):
        a = a.detach().cpu()
        if r.abs().max() == 0:  # e.g. dq with one visible key: rounding noise only
            err = a.double().abs().max().item()
            assert err <= NOISE_FACTOR * max(floor, unit_out) * scale, (name, err, scale)
            continue
        u = unit_out if a.dtype == torch.bfloat16 else FLOOR
        err, bound = rel_err(a, r), NOISE_FACTOR * floor + 2 * u
        assert err <= bound, f"{name}: normwise error {err:.3e} > bound {bound:.3e}"


def _check(outs, ref_fn, xs, weights, unit, what):
    """Outputs and input gradients of ``outs`` (from the GPU) against ``ref_fn`` in float64 on
    the same (rounded) values, within NOISE_FACTOR x the noise floor at ``unit``."""
    floors, refs = noise_floor(ref_fn, xs, unit=unit)
    _within(outs[0], floors, refs, [f"{what} out{j}" for j in range(len(refs))], U16)
    if outs[1] is not None:
        gfloors, grefs = grad_noise_floor(ref_fn, xs, weights, unit=unit)
        _within(outs[1], gfloors, grefs, [f"{what} d{j}" for j in range(len(grefs))], U16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize(
    "tq,tk,window", [(1, 1, 1), (100, 100, 16), (300, 300, 64), (256, 256, None), (40, 200, 32)]
)
def test_swa_backends_match_reference(dtype, tq, tk, window):
    q, k, v = (t.detach().to(dtype).float() for t in swa_inputs(2, 4, 2, tq, tk, 64, 64))
    do = torch.randn(2, 4, tq, 64, generator=torch.Generator().manual_seed(9))
    cx = [t.cuda().to(dtype) for t in (q, k, v)]
    names = available_backends("swa", *cx, window)
    assert "blockwise" in names
    unit = U16 if dtype == torch.bfloat16 else _float32_unit()

    def ref(q, k, v, dtype):
        return [naive_swa(q, k, v, window, dtype=dtype)]

    for name in names:
        outs, g = grads(
            lambda *x, n=name: [sliding_window_attention(*x, window, backend=n)], cx, [do.cuda()]
        )
        _check((outs, g), ref, [q, k, v], [do], unit, f"swa[{name}]")


@pytest.mark.parametrize("T", [1, 100, 300])
def test_recurrent_ops_on_cuda_match_reference(T):
    """The default mLSTM and Gated DeltaNet backends on CUDA with float32 inputs (forward)."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 2, T, 32, generator=g), torch.randn(2, 2, T, 32, generator=g)
    v = torch.randn(2, 2, T, 48, generator=g)
    i, f = torch.randn(2, 2, T, generator=g), torch.randn(2, 2, T, generator=g) + 2
    xs = [q, k, v, i, f]
    cx = [t.cuda() for t in xs]
    name = select_backend("mlstm", None, *cx).name
    with torch.no_grad():
        h, _ = mlstm(*cx)
    _check(
        ([h], None),
        lambda *a, dtype: [naive_mlstm(*a, eps=EPS, dtype=dtype)[0]],
        xs,
        None,
        UTF32 if name == "triton" else _float32_unit(),
        f"mlstm[{name}]",
    )
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    gd, beta = -torch.rand(2, 2, T, generator=g), torch.rand(2, 2, T, generator=g)
    xs = [qn, kn, v, gd, beta]
    cx = [t.cuda() for t in xs]
    name = select_backend("gated_delta", None, *cx).name
    with torch.no_grad():
        o, _ = gated_delta_rule(*cx)
    _check(
        ([o], None),
        lambda *a, dtype: [naive_gated_delta(*a, dtype=dtype)[0]],
        xs,
        None,
        UTF32 if name == "fla" else _float32_unit(),
        f"gated_delta[{name}]",
    )


@pytest.mark.parametrize("pattern", ["SX", "SD", "SA"])
def test_model_on_cuda_prefill_decode(pattern):
    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig.preset("tiny", layer_pattern=pattern)).cuda().eval()
    ids = torch.randint(0, 257, (2, 300), device="cuda")
    with torch.no_grad():
        full = model(ids, window=64)
        logits, state = model(ids[:, :250], window=64, return_state=True)
        outs = [logits]
        for t in range(250, 300):
            lg, state = model(ids[:, t : t + 1], window=64, state=state, return_state=True)
            outs.append(lg)
    assert (torch.cat(outs, 1) - full).abs().max() <= 1e-3 * full.abs().max()


# --------------------------------------------------------------------------- recurrent backends


def _mlstm_inputs(T, D=64, Dv=64, seed=2):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 2, T, D, generator=g), torch.randn(2, 2, T, D, generator=g)
    v = torch.randn(2, 2, T, Dv, generator=g)
    i = torch.randn(2, 2, T, generator=g)
    f = torch.randn(2, 2, T, generator=g) + 3
    return [q, k, v, i, f]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("T", [64, 100, 256, 300])
def test_mlstm_backends_match_reference(T, dtype):
    """Every mLSTM backend usable on CUDA (triton when mlstm_kernels + triton are installed,
    native, autograd) against the float64 cell loop on the same (dtype-rounded) values: h and
    the final state without gradients, h and every input gradient from an empty state."""
    xs = [x.to(dtype).float() for x in _mlstm_inputs(T)]
    dh = torch.randn(2, 2, T, 64, generator=torch.Generator().manual_seed(3))
    cx = [x.cuda().to(dtype) if j < 3 else x.cuda() for j, x in enumerate(xs)]
    names = available_backends("mlstm", *cx)
    assert "native" in names

    def ref_state(*a, dtype):
        h, (C, n, m) = naive_mlstm(*a, eps=EPS, dtype=dtype)
        return [h, C, n, m]

    def ref_h(*a, dtype):
        return [naive_mlstm(*a, eps=EPS, dtype=dtype)[0]]

    for name in names:
        # q, k, v tiles at the path's unit (bfloat16 inputs stay bfloat16 tiles, float32 ones
        # go through TF32 in Triton's tl.dot); the gates are float32 everywhere
        tile = U16 if dtype == torch.bfloat16 else (UTF32 if name == "triton" else U32)
        unit = [tile, tile, tile, U32, U32]
        with torch.no_grad():
            h, st = mlstm(*cx, backend=name, output_final_state=True)
        _check(([h, *st], None), ref_state, xs, None, unit, f"mlstm[{name}] h,C,n,m")
        outs, g = grads(lambda *a, n=name: [mlstm(*a, backend=n)[0]], cx, [dh.cuda()])
        _check((outs, g), ref_h, xs, [dh], unit, f"mlstm[{name}] grads")
    if "triton" in names and T % 64 == 0 and dtype == torch.float32:
        # the bound has power: mlstm_kernels' own gradient (denominator and m held constant)
        # must fail it (its m0 = 0 empty state matches the reference up to eps terms). On the
        # CPU with a stand-in of that gradient: 7-10x the float32/TF32 bound at T = 64 and
        # 256, but only 0.6-1.5x the bfloat16 one, so bfloat16 cases are not held to this.
        from mlstm_kernels.torch import get_mlstm_kernel

        raw = get_mlstm_kernel("chunkwise--triton_xl_chunk")
        gfloors, grefs = grad_noise_floor(ref_h, xs, [dh], unit=[UTF32] * 3 + [U32] * 2)
        _, g = grads(lambda *a: [raw(*a, chunk_size=128 if T % 128 == 0 else 64)], cx, [dh.cuda()])
        worst = max(
            rel_err(g[j].cpu(), grefs[j]) / (NOISE_FACTOR * gfloors[j] + 2 * U16)
            for j in (0, 1, 3, 4)
        )
        assert worst > 1, f"the raw kernel's gradient passes the bound ({worst:.2f} of it)"


def test_mlstm_triton_is_chosen_and_keeps_state_gradients_exact():
    pytest.importorskip("mlstm_kernels")
    pytest.importorskip("triton")
    xs = [x.cuda() for x in _mlstm_inputs(256)]
    assert select_backend("mlstm", None, *xs).name == "triton"
    # gradients into an initial state's n and m: the Triton kernel drops them, so the
    # registry must pick native for that call
    st = [
        torch.zeros(2, 2, 64, 64, device="cuda"),
        torch.zeros(2, 2, 64, device="cuda"),
        torch.zeros(2, 2, device="cuda", requires_grad=True),
    ]
    assert select_backend("mlstm", None, *xs, st, False).name == "native"


@pytest.mark.parametrize("T", [1, 63, 64, 200])
def test_gated_delta_backends_match_reference(T):
    """fla (bfloat16, when flash-linear-attention is installed) and native against the float64
    loop on the same bfloat16-rounded values: o, final state and gradients, with an initial
    state."""
    g = torch.Generator().manual_seed(4)
    q = F.normalize(torch.randn(2, 2, T, 64, generator=g), dim=-1)
    k = F.normalize(torch.randn(2, 2, T, 64, generator=g), dim=-1)
    v = torch.randn(2, 2, T, 64, generator=g)
    gd = -F.softplus(torch.randn(2, 2, T, generator=g))
    beta = torch.rand(2, 2, T, generator=g)
    S0 = 0.3 * torch.randn(2, 2, 64, 64, generator=g)
    xs = [x.bfloat16().float() for x in (q, k, v, gd, beta)] + [S0]
    do = torch.randn(2, 2, T, 64, generator=g)
    dS = torch.randn(2, 2, 64, 64, generator=g)
    cx = [x.cuda().bfloat16() if j < 3 else x.cuda() for j, x in enumerate(xs)]
    names = available_backends("gated_delta", *cx[:5])
    assert "native" in names

    def ref(q, k, v, gd, beta, S0, dtype):
        o, S = naive_gated_delta(q, k, v, gd, beta, initial_state=S0, dtype=dtype)
        return [o, S]

    for name in names:

        def run(q, k, v, gd, beta, S0, n=name):
            o, S = gated_delta_rule(
                q, k, v, gd, beta, initial_state=S0, output_final_state=True, backend=n
            )
            assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
            return [o, S]

        outs, gr = grads(run, cx, [do.cuda(), dS.cuda()])
        _check((outs, gr), ref, xs, [do, dS], U16, f"gated_delta[{name}]")


@pytest.mark.parametrize("op", ["mlstm", "gated_delta"])
def test_gpu_backends_time_against_native(op, capsys):
    """Not an assertion on speed: prints the fwd+bwd time of each usable backend (T=4096)."""
    import time

    T = 4096
    if op == "mlstm":
        xs = [x.cuda() for x in _mlstm_inputs(T)]
        call = lambda name, a: mlstm(*a, backend=name)[0]  # noqa: E731
    else:
        xs = [x.cuda() for x in _mlstm_inputs(T)]
        xs[0] = torch.nn.functional.normalize(xs[0], dim=-1).bfloat16()
        xs[1] = torch.nn.functional.normalize(xs[1], dim=-1).bfloat16()
        xs[2] = xs[2].bfloat16()
        xs[3], xs[4] = -torch.nn.functional.softplus(xs[3]), torch.sigmoid(xs[4])
        call = lambda name, a: gated_delta_rule(*a, backend=name)[0]  # noqa: E731
    for name in available_backends(op, *xs):
        for _ in range(3):
            a = [x.clone().requires_grad_() for x in xs]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call(name, a).float().sum().backward()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        with capsys.disabled():
            print(f"\n{op} {name}: fwd+bwd T={T} {dt * 1e3:.1f} ms")
