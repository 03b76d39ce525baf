"""Weight-only int8 / bfloat16 decode weights (swax.quant) against float32.

The int8 matrices are checked against a quantization written out here row by row (scale =
max |row| / 127, round to nearest, clamp to ±127); the layers against float32 products with
the dequantized (int8) or rounded (bfloat16) matrices, within float32's own error; whole models
against the float64 model, within NOISE_FACTOR times what rounding the weights to the format
(random draws of the same size) moves the logits.
"""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import swax.quant
from swax import SwaxConfig, SwaxLM
from swax.generate import generate, prefill
from swax.quant import (
    BF16Linear,
    DecodeWeightsLM,
    Int8Linear,
    decode_weight_bytes,
    decode_weights,
    greedy_agreement,
    quantize_int8,
)
from tests.cli.test_cli import assert_one_line_error, run_inprocess
from tests.helpers import FLOOR, NOISE_FACTOR, U16, U32, rel_err

VOCAB = 61
FORMATS = ["int8", "bf16"]


def model_for(seed: int = 0, **overrides) -> SwaxLM:
    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=VOCAB, d_model=32, n_layers=4, n_heads=4, window=8, chunk_size=16, init_std=0.5
    )
    return SwaxLM(SwaxConfig(**(cfg | overrides))).eval()


def naive_int8(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric int8 in numpy, one row at a time: (q, scale)."""
    w = w.detach().numpy().astype(np.float32)
    q = np.zeros(w.shape, dtype=np.int8)
    scale = np.ones(w.shape[0], dtype=np.float32)
    for n, row in enumerate(w):
        amax = np.float32(np.max(np.abs(row)))
        if amax == 0:
            continue
        scale[n] = amax / np.float32(127)
        q[n] = np.clip(np.rint(row / scale[n]), -127, 127).astype(np.int8)
    return q, scale


def product_bound(x: torch.Tensor, w: torch.Tensor, unit: float) -> torch.Tensor:
    """|x| @ |w|ᵀ · K · unit: the error bound of a float dot product of length K whose terms
    are each rounded by at most ``unit`` relatively (float64, elementwise per output)."""
    return (x.double().abs() @ w.double().abs().T) * w.shape[1] * unit


@pytest.fixture(params=["F.linear", "product-sum"])
def path(request, monkeypatch):
    """The layers' two ways: F.linear on the converted matrix (eager, many rows), and the
    product-and-sum of one row inside a compiled graph (swax.quant's test of that made true
    here, so the eager ops of that form run)."""
    if request.param == "product-sum":
        monkeypatch.setattr(swax.quant, "_compiling", lambda: True)
    return request.param


@pytest.fixture
def weights():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 48, generator=g)
    w[3] = 0.0  # an all-zero row
    w[5, 7] = 40.0  # one outlier: a coarse scale for that row only
    return w


@pytest.mark.parametrize("rows", [1, 5])
def test_int8_layer_against_a_naive_quantization(weights, rows, path):
    lin = nn.Linear(48, 37, bias=True)
    with torch.no_grad():
        lin.weight.copy_(weights)
    q_ref, s_ref = naive_int8(weights)
    layer = Int8Linear.from_linear(lin)
    assert layer.weight_int8.dtype == torch.int8 and layer.scale.dtype == torch.float32
    assert np.array_equal(layer.weight_int8.numpy(), q_ref)
    assert np.array_equal(layer.scale.numpy(), s_ref)
    deq = torch.from_numpy(q_ref.astype(np.float32) * s_ref[:, None])
    assert torch.equal(layer.dequantized(), deq)
    # every element within half a step of its row
    assert ((deq - weights).abs() <= torch.from_numpy(s_ref)[:, None] / 2 * (1 + 4 * U32)).all()
    assert (layer.weight_int8[3] == 0).all()
    x = torch.randn(rows, 48, generator=torch.Generator().manual_seed(1))
    expected = x.double() @ deq.double().T + lin.bias.double()
    err = (layer(x).double() - expected).abs()
    bound = product_bound(x, deq, U32) + 4 * U32 * expected.abs()
    assert (err <= bound).all(), float((err - bound).max())
    # and the 3-D input of a prefill, (B, T, K), through the other path for one row
    y3 = layer(x[None].expand(2, rows, 48))
    assert y3.shape == (2, rows, 37)
    assert ((y3[1].double() - expected).abs() <= bound).all()


@pytest.mark.parametrize("rows", [1, 5])
def test_bf16_layer_within_bf16_rounding_of_float32(weights, rows, path):
    lin = nn.Linear(48, 37, bias=False)
    with torch.no_grad():
        lin.weight.copy_(weights)
    layer = BF16Linear.from_linear(lin)
    assert layer.weight.dtype == torch.bfloat16
    assert torch.equal(layer.weight, weights.to(torch.bfloat16))
    x = torch.randn(rows, 48, generator=torch.Generator().manual_seed(1))
    y = layer(x)
    assert y.dtype == torch.float32
    exact = x.double() @ weights.double().T
    # each weight is rounded by at most U16 (relative); the sum in float32 adds K·U32
    bound = (x.double().abs() @ weights.double().abs().T) * U16 + product_bound(x, weights, U32)
    err = (y.double() - exact).abs()
    assert (err <= bound).all()
    # it is not float32: the rounding shows (the test would pass a float32 layer otherwise)
    assert err.max() > product_bound(x, weights, U32).max()


def test_quantize_int8_is_the_layers_quantization(weights):
    q, s = quantize_int8(weights)
    q_ref, s_ref = naive_int8(weights)
    assert np.array_equal(q.numpy(), q_ref) and np.array_equal(s.numpy(), s_ref)


def test_the_original_model_is_untouched():
    model = model_for()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ptrs = {k: v.data_ptr() for k, v in model.state_dict().items()}
    kinds = {n: type(m) for n, m in model.named_modules()}
    for fmt in FORMATS:
        q = decode_weights(model, fmt)
        assert q is not model and isinstance(q, DecodeWeightsLM)
        generate(q, torch.tensor([[1, 2, 3]]), 4, compile=False)
        with torch.no_grad():  # nothing of the copy is shared with the original
            for p in q.parameters():
                if p.is_floating_point():
                    p.add_(1.0)
            q.embed.weight.add_(1.0)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(after[k].data_ptr() == ptrs[k] for k in ptrs)
    assert {n: type(m) for n, m in model.named_modules()} == kinds
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_matrix_is_converted_and_the_bytes_shrink(fmt):
    model = model_for()
    q = decode_weights(model, fmt)
    assert not any(isinstance(m, nn.Linear) for m in q.modules())
    cls = Int8Linear if fmt == "int8" else BF16Linear
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert sum(isinstance(m, cls) for m in q.modules()) == n_linear + 1  # + the tied head
    assert q.num_parameters() == model.num_parameters()
    assert not any(p.requires_grad for p in q.parameters())
    full = decode_weight_bytes(model)
    assert full == 4 * model.num_parameters()
    ratio = decode_weight_bytes(q) / full
    assert ratio < (0.35 if fmt == "int8" else 0.6), ratio
    assert decode_weights(model, "float32") is model


def format_noise_floor(model: SwaxLM, fmt: str, fn, draws: int = 3) -> tuple[float, torch.Tensor]:
    """(floor, float64 output) of ``fn(model)``: the normwise change of the float64 output when
    every weight matrix (and the embedding, the tied head) of a float64 copy is perturbed by a
    random rounding of the format's size: ±2^-8 relative (bfloat16), ±scale/2 of its row
    (int8)."""
    model64 = copy.deepcopy(model).double()
    with torch.no_grad():
        ref = fn(model64)
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(draws):
        m = copy.deepcopy(model64)
        with torch.no_grad():
            for mod in m.modules():
                if not isinstance(mod, (nn.Linear, nn.Embedding)):
                    continue
                w = mod.weight
                u = 2 * torch.rand(w.shape, generator=g, dtype=torch.float64) - 1
                if fmt == "bf16":
                    w.mul_(1 + U16 * u)
                else:
                    w.add_(u * w.abs().amax(1, keepdim=True) / 127 / 2)
            worst = max(worst, rel_err(fn(m), ref))
    return worst, ref


FORMAT_FACTOR = 3
"""A model with converted weights may be at most this many times further from the float64
model than the random roundings of :func:`format_noise_floor` move it (its own rounding is one
such draw: 0.4-0.8 times the worst of three in trials; float32's arithmetic adds ~1e-4 of it)."""


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tie", [True, False])
def test_model_logits_within_the_formats_rounding(fmt, tie, path):
    model = model_for(tie_embeddings=tie, logit_soft_cap=None if tie else 3.0, init_std=0.02)
    q = decode_weights(model, fmt)
    ids = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(2))
    for name, x in (("prefill", ids), ("one row", ids[:1, :1])):
        floor, ref = format_noise_floor(model, fmt, lambda m, x=x: m(x))
        with torch.no_grad():
            err = rel_err(q(x), ref)
        assert err <= FORMAT_FACTOR * floor, f"{fmt} {name}: {err:.3e} vs floor {floor:.3e}"
        # the floor is the format's, far above float32's: the check is not vacuous
        assert floor > 1e3 * U32


@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_decode_eager_and_compiled(fmt):
    """Eager greedy decoding runs, its first logits are the prefill's within the format's
    rounding of float32's, and the compiled step (aot_eager in the fast tier) gives the eager
    step's tokens."""
    model = model_for()
    q = decode_weights(model, fmt)
    ids = torch.randint(0, VOCAB, (1, 13), generator=torch.Generator().manual_seed(3))
    out = generate(q, ids, 24, compile=False)
    assert out.shape == (1, 37) and torch.equal(out[:, :13], ids)
    assert int(out.max()) < VOCAB
    floor, ref = format_noise_floor(model, fmt, lambda m: m(ids)[:, -1])
    logits, _ = prefill(q, ids)
    assert rel_err(logits, ref) <= NOISE_FACTOR * floor + FLOOR
    assert torch.equal(generate(q, ids, 24, compile=True), out)


def test_agreement_counts_divergence():
    model = model_for()
    prompts = [
        torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(s)) for s in range(2)
    ]
    same = greedy_agreement(model, model, prompts, 16)
    assert same["prefix"] == same["overall"] == same["forced"] == 1.0
    assert same["max_logit_diff"] == 0.0
    other = model_for(seed=1)  # another model: its tokens differ somewhere
    diff = greedy_agreement(model, other, prompts, 16)
    assert diff["prefix"] < 1.0 and diff["forced"] < 1.0 and diff["max_logit_diff"] > 0.1
    assert diff["prefix"] <= diff["overall"]


def test_bad_uses_are_clear_errors(tmp_path):
    model = model_for()
    with pytest.raises(ValueError, match="int4"):
        decode_weights(model, "int4")
    q = decode_weights(model, "int8")
    with pytest.raises(ValueError, match="already"):
        decode_weights(q, "bf16")
    with pytest.raises(TypeError, match="float32 model"):
        q.save_pretrained(tmp_path / "q")
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("fmt", ["int8", "bf16", "float32"])
def test_generate_command_takes_weights(capsys, fmt):
    r = run_inprocess(
        capsys,
        "generate",
        "--preset",
        "tiny",
        "--weights",
        fmt,
        "--prompt",
        "abc",
        "--max-new-tokens",
        "4",
        "--no-stream",
        "--no-compile",
    )
    assert r.returncode == 0, r.stderr
    assert ("4 new tokens" in r.stderr) and ((f"{fmt} weights" in r.stderr) == (fmt != "float32"))


def test_generate_command_rejects_other_weights(capsys):
    r = run_inprocess(capsys, "generate", "--preset", "tiny", "--weights", "int4")
    assert_one_line_error(r, "--weights", "int4")
