"""GPU paths against the CPU references (marker `gpu`; skipped without CUDA)."""

import pytest
import torch
from helpers import rel_err

from swax import SwaxConfig, SwaxLM
from swax.ops import (
    available_backends,
    gated_delta_rule,
    mlstm,
    select_backend,
    sliding_window_attention,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "tq,tk,window", [(1, 1, 1), (100, 100, 16), (300, 300, 64), (256, 256, None), (40, 200, 32)]
)
def test_swa_backends_match_cpu_reference(dtype, tq, tk, window):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, tq, 64, generator=g)
    k = torch.randn(2, 2, tk, 64, generator=g)
    v = torch.randn(2, 2, tk, 64, generator=g)
    ref = sliding_window_attention(q, k, v, window, backend="reference")
    qc, kc, vc = (t.cuda().to(dtype).requires_grad_() for t in (q, k, v))
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    names = available_backends("swa", qc, kc, vc, window)
    assert "blockwise" in names
    for name in names:
        out = sliding_window_attention(qc, kc, vc, window, backend=name)
        err = (out.float().cpu() - ref).abs().max().item()
        assert err < tol, (name, err)
        out.float().sum().backward()


@pytest.mark.parametrize("T", [1, 100, 300])
def test_recurrent_ops_on_cuda_match_cpu(T):
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 2, T, 32, generator=g), torch.randn(2, 2, T, 32, generator=g)
    v = torch.randn(2, 2, T, 48, generator=g)
    i, f = torch.randn(2, 2, T, generator=g), torch.randn(2, 2, T, generator=g) + 2
    h_cpu, s_cpu = mlstm(q, k, v, i, f, output_final_state=True)
    h_gpu, s_gpu = mlstm(*(t.cuda() for t in (q, k, v, i, f)), output_final_state=True)
    assert (h_gpu.cpu() - h_cpu).abs().max() < 1e-3
    qn, kn = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    gd, beta = -torch.rand(2, 2, T, generator=g), torch.rand(2, 2, T, generator=g)
    o_cpu, _ = gated_delta_rule(qn, kn, v, gd, beta)
    o_gpu, _ = gated_delta_rule(*(t.cuda() for t in (qn, kn, v, gd, beta)))
    assert (o_gpu.cpu() - o_cpu).abs().max() < 1e-3


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


def _rel(a, b):
    return rel_err(a, b, floor=1e-6)


def _mlstm_inputs(T, D=64, Dv=64, seed=2):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 2, T, D, generator=g), torch.randn(2, 2, T, D, generator=g)
    v = torch.randn(2, 2, T, Dv, generator=g)
    i = 2 * torch.randn(2, 2, T, generator=g)
    f = torch.randn(2, 2, T, generator=g) + 3
    return [q, k, v, i, f]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("T", [64, 100, 256, 300])
def test_mlstm_backends_match_cpu_reference(T, dtype):
    """Every mLSTM backend usable on CUDA (triton when mlstm_kernels + triton are installed,
    native, autograd) against the native kernel on the CPU in float32 on the same
    (dtype-rounded) values: h, final state (no grad) and input gradients from an empty state."""
    xs = [x.to(dtype).float() for x in _mlstm_inputs(T)]
    dh = torch.randn(2, 2, T, 64, generator=torch.Generator().manual_seed(3))
    ref_x = [x.clone().requires_grad_() for x in xs]
    h_ref, _ = mlstm(*ref_x, backend="native")
    h_ref.backward(dh)
    with torch.no_grad():
        _, s_ref = mlstm(*xs, backend="native", output_final_state=True)
    cx = [x.cuda().to(dtype) if j < 3 else x.cuda() for j, x in enumerate(xs)]
    names = available_backends("mlstm", *cx)
    assert "native" in names
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    for name in names:
        with torch.no_grad():
            h, s = mlstm(*cx, backend=name, output_final_state=True)
        assert _rel(h, h_ref) < tol, (name, "h", _rel(h, h_ref))
        for a, b, what in zip(s, s_ref, "Cnm"):
            assert _rel(a, b) < tol, (name, what, _rel(a, b))
        gx = [x.clone().requires_grad_() for x in cx]
        h, _ = mlstm(*gx, backend=name)
        h.float().backward(dh.cuda())
        for x, r, what in zip(gx, ref_x, "qkvif"):
            assert _rel(x.grad, r.grad) < 10 * tol, (name, "d" + what, _rel(x.grad, r.grad))


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
def test_gated_delta_backends_match_cpu_reference(T):
    """fla (bfloat16, when flash-linear-attention is installed) and native against the CPU
    native path in float32 on the same bfloat16-rounded values: o, final state and gradients,
    with an initial state."""
    g = torch.Generator().manual_seed(4)
    q = torch.nn.functional.normalize(torch.randn(2, 2, T, 64, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(2, 2, T, 64, generator=g), dim=-1)
    v = torch.randn(2, 2, T, 64, generator=g)
    gd = -torch.nn.functional.softplus(torch.randn(2, 2, T, generator=g))
    beta = torch.rand(2, 2, T, generator=g)
    S0 = 0.3 * torch.randn(2, 2, 64, 64, generator=g)
    xs = [q, k, v, gd, beta]
    xs = [x.bfloat16().float() for x in xs]  # the values bf16 inputs carry
    do = torch.randn(2, 2, T, 64, generator=g)
    dS = torch.randn(2, 2, 64, 64, generator=g)
    ref = [x.clone().requires_grad_() for x in xs + [S0]]
    o_ref, S_ref = gated_delta_rule(
        *ref[:5], initial_state=ref[5], output_final_state=True, backend="native"
    )
    ((o_ref * do).sum() + (S_ref * dS).sum()).backward()
    cx = [x.cuda().bfloat16() if j < 3 else x.cuda() for j, x in enumerate(xs)]
    names = available_backends("gated_delta", *cx)
    assert "native" in names
    for name in names:
        gx = [x.clone().requires_grad_() for x in cx + [S0.cuda()]]
        o, S = gated_delta_rule(*gx[:5], initial_state=gx[5], output_final_state=True, backend=name)
        assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
        assert _rel(o, o_ref) < 3e-2, (name, "o", _rel(o, o_ref))
        assert _rel(S, S_ref) < 3e-2, (name, "S", _rel(S, S_ref))
        ((o.float() * do.cuda()).sum() + (S * dS.cuda()).sum()).backward()
        for x, r, what in zip(gx, ref, ["q", "k", "v", "g", "beta", "S0"]):
            assert _rel(x.grad, r.grad) < 5e-2, (name, "d" + what, _rel(x.grad, r.grad))


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
