"""GPU paths against the CPU references (marker `gpu`; skipped without CUDA)."""

import pytest
import torch

from swax import SwaxConfig, SwaxLM
from swax.ops import available_backends, gated_delta_rule, mlstm, sliding_window_attention

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tq,tk,window", [(1, 1, 1), (100, 100, 16), (300, 300, 64),
                                          (256, 256, None), (40, 200, 32)])
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
            lg, state = model(ids[:, t:t + 1], window=64, state=state, return_state=True)
            outs.append(lg)
    assert (torch.cat(outs, 1) - full).abs().max() <= 1e-3 * full.abs().max()
