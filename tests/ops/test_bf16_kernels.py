"""bfloat16 inputs to the CPU kernels against the float64 references (issue 60).

For bfloat16 inputs the kernels (sliding-window attention's training and forward-only paths,
full causal attention's fused SDPA, the mLSTM chunkwise forward and backward, Gated DeltaNet's
chunk form) run their matrix products on bfloat16 operands with float32 accumulation and keep
the gates, the recurrent state and the normalisers in float32 (:mod:`swax.ops.precision`).

Each test runs the kernel forward and backward on bfloat16 inputs and compares it with the
float64 naive reference (tests/helpers.py) on the same bfloat16-valued inputs. **The tolerance
comes from bfloat16's precision**: ``NOISE_FACTOR`` times the error that one bfloat16 rounding
(unit roundoff 2^-8, :data:`~tests.helpers.BF16_TILES`) of the tile inputs alone causes in the
float64 reference on these very inputs (:func:`~tests.helpers.noise_floor`; the gates and the
initial state, kept in float32, get float32's 2^-24), plus one rounding of a bfloat16 result
(2^-8): what the reduction lengths and the inputs' conditioning make of 2^-8, measured, not a
constant fitted to one machine. The inputs are well conditioned (the mLSTM's q and k share a
positive mean, so its denominator stays away from zero), which keeps the bound tight enough that
a defect (errors of order 1, or a stage that loses more than bfloat16's digits) fails.
Each test also checks that the products did run in bfloat16 (:class:`~tests.helpers.ProductDtypes`).
``make test-isa`` runs this file under ``ATEN_CPU_CAPABILITY=avx2`` and ``=default`` too.
"""

from __future__ import annotations

import pytest
import torch

from swax.ops import gated_delta_rule, mlstm, sliding_window_attention
from tests.helpers import (
    BF16_TILES,
    FLOOR,
    NOISE_FACTOR,
    U16,
    U32,
    ProductDtypes,
    gated_delta_inputs,
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
    swa_inputs,
)

pytestmark = pytest.mark.usefixtures("one_thread")
BF = torch.bfloat16


def check(outputs, floors, refs, names, rounded):
    """Each output within NOISE_FACTOR x its bfloat16 noise floor of the float64 reference, plus
    one bfloat16 rounding (U16) for the outputs returned in bfloat16 (``rounded``), else FLOOR."""
    for a, floor, e, name, r in zip(outputs, floors, refs, names, rounded):
        err, bound = rel_err(a, e), NOISE_FACTOR * floor + (U16 if r else FLOOR)
        assert err <= bound, (
            f"{name}: normwise error {err:.3e} > {NOISE_FACTOR} x bfloat16 noise floor "
            f"{floor:.3e} (+{U16 if r else FLOOR:.1e})"
        )


def all_bf16(spy: ProductDtypes, allowed=lambda rec: False) -> None:
    """Every recorded product took bfloat16 operands (``allowed``: the float32 ones by design)."""
    assert spy.records, "no matrix product recorded"
    wrong = [r for r in spy.other(BF) if not allowed(r)]
    assert not wrong, f"products not in bfloat16: {wrong[:4]}"


# --------------------------------------------------------------------------- mLSTM


def _mlstm_inputs(T, seed):
    q, k, v, i, f = mlstm_inputs(T, seed=seed, i_scale=1.0)
    return [(q + 1).to(BF), (k + 1).to(BF), v.to(BF), i, f]


def _naive_mlstm(q, k, v, i, f, *state, dtype=torch.float64):
    h, (C, n, m) = naive_mlstm(q, k, v, i, f, state=state or None, dtype=dtype)
    return [h, C, n, m]


@pytest.mark.parametrize("T,chunk,with_state", [(7, 16, False), (100, 16, False),
                                                (200, 64, False), (100, 16, True)])  # fmt: skip
def test_mlstm_chunk_bf16(T, chunk, with_state):
    inputs = _mlstm_inputs(T, seed=T)
    state = mlstm_state(seed=3) if with_state else []
    units = [BF16_TILES] * 3 + [U32] * (2 + len(state))
    floors, refs = noise_floor(_naive_mlstm, [*inputs, *state], unit=units)
    dh = loss_weights(refs[0].shape, seed=T)[0]
    gfloors, grefs = grad_noise_floor(
        lambda *x, dtype: _naive_mlstm(*x, dtype=dtype)[:1], [*inputs, *state], [dh], unit=units
    )

    def op(q, k, v, i, f, *s):
        init = tuple(s) or None
        h, st = mlstm(q, k, v, i, f, init, output_final_state=True, chunk_size=chunk)
        return [h, *st]

    with ProductDtypes() as spy:
        outs = op(*inputs, *state)
        _, g = grads(lambda *x: op(*x)[:1], [*inputs, *state], [dh])
    all_bf16(spy)
    assert outs[0].dtype == BF and all(s.dtype == torch.float32 for s in outs[1:])
    check(outs, floors, refs, ["h", "C", "n", "m"], [True, False, False, False])
    names = ["dq", "dk", "dv", "di", "df", "dC0", "dn0", "dm0"][: len(g)]
    assert [x.dtype for x in g[:3]] == [BF] * 3
    check(g, gfloors, grefs, names, [True] * 3 + [False] * (len(g) - 3))


# --------------------------------------------------------------------------- Gated DeltaNet


def _naive_gdn(*xs, dtype=torch.float64):
    return list(naive_gated_delta(*xs, dtype=dtype))


@pytest.mark.parametrize("T,chunk", [(7, 16), (100, 16), (200, 64)])
def test_gated_delta_chunk_bf16(T, chunk):
    inputs = gated_delta_inputs(T, dtype=BF, seed=60 + T)  # q, k, v, g, beta bf16; S0 float32
    units = [BF16_TILES] * 3 + [U32] * 3  # g and beta are kept (exactly) in float32
    floors, refs = noise_floor(_naive_gdn, inputs, unit=units)
    W = loss_weights(refs[0].shape, refs[1].shape, seed=T)
    gfloors, grefs = grad_noise_floor(_naive_gdn, inputs, W, unit=units)

    def op(*xs):
        return list(gated_delta_rule(*xs, output_final_state=True, chunk_size=chunk))

    with ProductDtypes() as fwd:
        with torch.no_grad():
            o, S = op(*inputs)
    all_bf16(fwd)
    with ProductDtypes() as both:
        _, g = grads(op, inputs, W)
    # the triangular solve stays float32 (as fla's), so does its gradient's (C x C) product
    all_bf16(both, allowed=lambda rec: rec[3] == (min(chunk, T),) * 2)
    assert o.dtype == BF and S.dtype == torch.float32
    check([o, S], floors, refs, ["o", "S"], [True, False])
    names = ["dq", "dk", "dv", "dg", "dbeta", "dS0"]
    check(g, gfloors, grefs, names, [x.dtype == BF for x in inputs])


# --------------------------------------------------------------------------- attention

SWA_CASES = [  # (Tq, Tk, window): blocks, several blocks, full causal (fused SDPA), a cache
    (100, 100, 16),
    (300, 300, 64),
    (33, 33, None),
    (25, 90, 20),
]


def _naive_swa_fn(window):
    return lambda q, k, v, dtype: [naive_swa(q, k, v, window, dtype=dtype)]


@pytest.mark.parametrize("tq,tk,window", SWA_CASES)
def test_swa_training_path_bf16(tq, tk, window):
    q, k, v = (t.detach() for t in swa_inputs(2, 4, 2, tq, tk, 32, 32, BF, seed=tq + tk))
    ref = _naive_swa_fn(window)
    floors, refs = noise_floor(ref, [q, k, v], unit=BF16_TILES)
    do = loss_weights(refs[0].shape, seed=tq)[0]
    gfloors, grefs = grad_noise_floor(ref, [q, k, v], [do], unit=BF16_TILES)
    with ProductDtypes() as spy:
        (o,), g = grads(lambda *x: [sliding_window_attention(*x, window)], [q, k, v], [do])
    all_bf16(spy)
    assert o.dtype == BF and all(x.dtype == BF for x in g)
    check([o], floors, refs, ["o"], [True])
    check(g, gfloors, grefs, ["dq", "dk", "dv"], [True] * 3)


@pytest.mark.parametrize("flat", [True, False], ids=["one stream", "per head"])
@pytest.mark.parametrize("tq,tk,window", [(300, 300, 40), (100, 160, 64), (7, 7, 3)])
def test_swa_forward_path_bf16(tq, tk, window, flat, monkeypatch):
    """``blockwise_fwd`` (inference, prefill, evaluation) on bfloat16 tiles; both of its paths."""
    from swax.ops.swa import forward as swa_forward

    monkeypatch.setattr(swa_forward, "_flat_fits", lambda *a: flat)
    q, k, v = (t.detach() for t in swa_inputs(2, 4, 1, tq, tk, 16, 16, BF, seed=tq))
    floors, refs = noise_floor(_naive_swa_fn(window), [q, k, v], unit=BF16_TILES)
    with torch.no_grad(), ProductDtypes() as spy:
        o = sliding_window_attention(q, k, v, window, backend="blockwise_fwd")
    all_bf16(spy)
    assert o.dtype == BF
    check([o], floors, refs, ["o"], [True])


def test_the_bound_tells_a_stage_that_loses_digits():
    """The bound is not vacuous: the mLSTM kernel fed q rounded to two fractional bits (a stage
    that loses more than bfloat16's rounding) lands outside it."""
    inputs = _mlstm_inputs(100, seed=5)
    floors, refs = noise_floor(_naive_mlstm, inputs, unit=[BF16_TILES] * 3 + [U32] * 2)
    lossy = (torch.round(inputs[0].float() * 4) / 4).to(BF)
    h = mlstm(lossy, *inputs[1:], chunk_size=16)[0]
    assert rel_err(h, refs[0]) > NOISE_FACTOR * floors[0] + U16
