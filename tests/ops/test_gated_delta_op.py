"""Tests for swax.ops.gated_delta against an independent float64 reference.

The reference (``naive_gated_delta`` in tests/helpers.py) is a per-step transcription of fla's
``naive_recurrent_gated_delta_rule`` (fla/ops/gated_delta_rule/naive.py), written there and run
in float64; nothing from swax is used to build expected values.

Tolerances come from the precision (errors are normwise, see tests/helpers.py):

- float64 inputs: ``TOL64`` = 2^13 float64 unit roundoffs (9e-13). The chunk form is an exact
  algebraic rewrite of the recurrence, so it must agree to round-off (observed <= 8e-16).
- float32: within ``NOISE_FACTOR`` times the error float32 rounding alone makes on the same
  inputs (the loop run in float32; the float64 loop on inputs perturbed by one rounding),
  forward and gradients, measured per input set. Observed at most 1.5x that floor; the
  deliberate bugs this file guards against (masks, decay placement, chunk order, padding,
  scale) give errors of order 1. Two float32 results of the op (chunk vs recurrent, chained vs
  one pass) may differ by twice that.
- bfloat16 inputs: the recurrent mode computes in float32, ``BF16_TOL`` = 4 bfloat16 unit
  roundoffs on o and input gradients (the reference sees the same bf16-rounded inputs; what
  remains is rounding o and the gradients to bf16, observed <= 1.6 unit roundoffs). The chunk
  form's products take bfloat16 tiles of q, k, v: within ``NOISE_FACTOR`` times the error one
  bfloat16 rounding of those alone makes (+ the result's rounding).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from swax.ops.gated_delta import gated_delta_rule, gated_delta_step
from tests.helpers import (
    BF16_TILES,
    NOISE_FACTOR,
    U16,
    U32,
    assert_close,
    assert_within_noise,
    gated_delta_inputs,
    grad_noise_floor,
    grads,
    loss_weights,
    naive_gated_delta,
    noise_floor,
    unit_roundoff,
)

pytestmark = pytest.mark.usefixtures("one_thread")

B, H = 2, 2
TOL64 = 2**13 * unit_roundoff(torch.float64)
BF16_TOL = 4 * U16
BF16_UNITS = [BF16_TILES] * 3 + [U32] * 3
"""The chunk form takes bfloat16 q, k, v as bfloat16 tiles, g, beta and the state in float32
(tests/ops/test_bf16_kernels.py holds it to more inputs)."""
CONFIGS = [("recurrent", 64), ("chunk", 64), ("chunk", 16)]
CONFIG_IDS = ["recurrent", "chunk64", "chunk16"]
NAMES = ["q", "k", "v", "g", "beta", "initial_state"]


# --------------------------------------------------------------------------- reference
def make_inputs(T, dk=16, dv=32, dtype=torch.float32, seed=0, gate="softplus", b=B, h=H):
    return gated_delta_inputs(T, dk, dv, dtype, seed, gate, b, h)


def _naive(*xs, scale=None, dtype=torch.float64):
    return list(naive_gated_delta(*xs, scale=scale, dtype=dtype))


def weights(T, dk=16, dv=32, seed=123):
    """Loss weights of (o, S)."""
    return loss_weights((B, H, T, dv), (B, H, dk, dv), seed=seed)


_CACHE: dict = {}


def reference(key, inputs, W=None, unit=U32):
    """(float32 noise floors of o and S, their float64 values), and with loss weights ``W``
    also (floors of the input gradients, float64 gradients); cached by ``key``: the same
    inputs are shared by the parametrisations over modes, and the Python loop is slow.
    ``unit``: BF16_UNITS for the chunk form's bfloat16 tiles."""
    if key not in _CACHE:
        fwd = noise_floor(_naive, inputs, unit=unit)
        _CACHE[key] = fwd if W is None else (fwd, grad_noise_floor(_naive, inputs, W, unit=unit))
    return _CACHE[key]


def op_grads(inputs, W, **kw):
    """((o, S), input gradients) of the op for the loss weights W."""
    outs, g = grads(
        lambda *xs: list(gated_delta_rule(*xs, output_final_state=True, **kw)), inputs, W
    )
    return outs, g


# ------------------------------------------------------------------ reference sanity
def test_reference_matches_closed_forms():
    """The reference itself: one step from zero, pure decay, and the matrix form."""
    q, k, v, g, beta, S0 = make_inputs(5, dtype=torch.float64)
    S0 = S0.double()
    scale = 16**-0.5
    o, S = naive_gated_delta(q[:, :, :1], k[:, :, :1], v[:, :, :1], g[:, :, :1], beta[:, :, :1])
    S_exp = beta[:, :, 0, None, None] * k[:, :, 0, :, None] * v[:, :, 0, None, :]
    torch.testing.assert_close(S, S_exp)
    o_exp = scale * beta[:, :, 0, None] * (q[:, :, 0] * k[:, :, 0]).sum(-1, keepdim=True)
    torch.testing.assert_close(o[:, :, 0], o_exp * v[:, :, 0])
    _, S = naive_gated_delta(q, k, v, g, torch.zeros_like(beta), S0)
    torch.testing.assert_close(S, S0 * g.sum(-1).exp()[..., None, None])
    # S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T   ((Dk, Dv) layout)
    S_m = S0
    eye = torch.eye(16, dtype=torch.float64)
    for t in range(5):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]
        P = eye - bt * kt[..., :, None] * kt[..., None, :]
        S_m = (
            g[:, :, t].exp()[..., None, None] * (P @ S_m)
            + bt * kt[..., :, None] * v[:, :, t, None, :]
        )
    _, S = naive_gated_delta(q, k, v, g, beta, S0)
    torch.testing.assert_close(S, S_m)


# ------------------------------------------------------------------------ forward
@pytest.mark.parametrize("T", [1, 7, 64, 65, 100, 200])
@pytest.mark.parametrize("mode,chunk_size", CONFIGS, ids=CONFIG_IDS)
def test_forward_matches_naive_float32(T, mode, chunk_size):
    q, k, v, g, beta, S0 = make_inputs(T, seed=T)
    floors, refs = reference(("fwd", T), [q, k, v, g, beta, S0])
    o, S = gated_delta_rule(q, k, v, g, beta, S0, True, mode=mode, chunk_size=chunk_size)
    assert o.dtype == torch.float32 and S.dtype == torch.float32
    assert o.shape == (B, H, T, 32) and S.shape == (B, H, 16, 32)
    assert_within_noise([o, S], floors, refs, ["o", "final state"])
    # also without an initial state
    floors, refs = reference(("fwd-no-state", T), [q, k, v, g, beta])
    o, S = gated_delta_rule(q, k, v, g, beta, None, True, mode=mode, chunk_size=chunk_size)
    names = ["o (no initial state)", "final state (no initial state)"]
    assert_within_noise([o, S], floors, refs, names)


@pytest.mark.parametrize("T", [1, 7, 64, 100, 200])
@pytest.mark.parametrize("chunk_size", [64, 16, 5])
def test_chunk_algebra_exact_in_float64(T, chunk_size):
    q, k, v, g, beta, S0 = make_inputs(T, dtype=torch.float64, seed=T + 1, gate="logsigmoid")
    o_ref, S_ref = naive_gated_delta(q, k, v, g, beta, S0)
    o, S = gated_delta_rule(q, k, v, g, beta, S0.double(), True, chunk_size=chunk_size)
    assert o.dtype == torch.float64
    assert_close(o, o_ref, TOL64, "o")
    assert_close(S, S_ref, TOL64, "final state")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_dk_larger_than_dv_and_custom_scale(mode):
    q, k, v, g, beta, S0 = make_inputs(37, dk=32, dv=8, seed=3)
    floors, refs = noise_floor(
        lambda *x, dtype: _naive(*x, scale=0.7, dtype=dtype), [q, k, v, g, beta, S0]
    )
    o, S = gated_delta_rule(q, k, v, g, beta, S0, True, mode=mode, chunk_size=16, scale=0.7)
    assert o.shape == (B, H, 37, 8) and S.shape == (B, H, 32, 8)
    assert_within_noise([o, S], floors, refs, ["o", "final state"])


# ----------------------------------------------------------------------- gradients
@pytest.mark.parametrize("T", [1, 7, 64, 100, 200])
@pytest.mark.parametrize("mode,chunk_size", CONFIGS, ids=CONFIG_IDS)
def test_gradients_match_naive_float32(T, mode, chunk_size):
    inputs = make_inputs(T, seed=10 + T)
    W = weights(T)
    _, (gfloors, g_ref) = reference(("grad", T), inputs, W)
    _, g_op = op_grads(inputs, W, mode=mode, chunk_size=chunk_size)
    assert all(a.dtype == torch.float32 for a in g_op)
    assert_within_noise(g_op, gfloors, g_ref, [f"grad {n}" for n in NAMES])


@pytest.mark.parametrize("T", [7, 100])
@pytest.mark.parametrize("chunk_size", [64, 16])
def test_chunk_matches_recurrent_forward_and_backward(T, chunk_size):
    inputs = make_inputs(T, dk=24, dv=16, seed=20 + T)
    W = weights(T, 24, 16)
    (floors, _), (gfloors, _) = reference(("chunk-vs-recurrent", T), inputs, W)
    (o_c, S_c), g_c = op_grads(inputs, W, mode="chunk", chunk_size=chunk_size)
    (o_r, S_r), g_r = op_grads(inputs, W, mode="recurrent", chunk_size=chunk_size)
    f2 = 2 * NOISE_FACTOR  # two float32 results, each within the noise of the reference
    assert_within_noise([o_c, S_c], floors, [o_r, S_r], ["o", "final state"], f2)
    assert_within_noise(g_c, gfloors, g_r, [f"grad {n}" for n in NAMES], f2)


def test_gradcheck_chunk_float64():
    q, k, v, g, beta, S0 = make_inputs(6, dk=3, dv=2, dtype=torch.float64, seed=5, b=1, h=1)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta, S0.double())]

    def op(*xs):
        o, S = gated_delta_rule(*xs, output_final_state=True, chunk_size=4)
        return o, S

    assert torch.autograd.gradcheck(op, leaves)


@pytest.mark.parametrize("T", [7, 100])
@pytest.mark.parametrize("mode,chunk_size", CONFIGS, ids=CONFIG_IDS)
def test_bfloat16_inputs(T, mode, chunk_size):
    inputs = make_inputs(T, dtype=torch.bfloat16, seed=30 + T)
    W = weights(T)
    (floors, (o_ref, S_ref)), (gfloors, g_ref) = reference(("bf16", T), inputs, W)
    (o, S), g_op = op_grads(inputs, W, mode=mode, chunk_size=chunk_size)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    tol = [BF16_TOL] * 6
    if mode == "chunk":  # bfloat16 tiles (q, k, v): the noise of one bfloat16 rounding of them
        (floors, _), (gfloors, _) = reference(("bf16 tiles", T), inputs, W, BF16_UNITS)
        tol = [NOISE_FACTOR * f + U16 for f in [floors[0], *gfloors]]
    assert_close(o, o_ref, tol[0], "o")
    # the state is float32 math on the same (bf16-valued) inputs (tiles aside)
    assert_within_noise([S], floors[1:], [S_ref], ["final state"])
    for name, a, e, t in zip(NAMES, g_op, g_ref, tol[1:]):
        assert a.dtype == inputs[NAMES.index(name)].dtype
        assert_close(a, e, t, f"grad {name}")


# ------------------------------------------------------------------- state passing
@pytest.mark.parametrize("mode,chunk_size", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("splits", [[1, 99], [37, 63], [70, 30], [1, 50, 1, 48], [64, 36]])
def test_split_sequences_chain_through_state(mode, chunk_size, splits):
    q, k, v, g, beta, S0 = make_inputs(sum(splits), seed=40)
    o_full, S_full = gated_delta_rule(q, k, v, g, beta, S0, True, mode=mode, chunk_size=chunk_size)
    S0_copy = S0.clone()
    S, outs, start = S0, [], 0
    for n in splits:
        sl = slice(start, start + n)
        o, S = gated_delta_rule(
            q[:, :, sl],
            k[:, :, sl],
            v[:, :, sl],
            g[:, :, sl],
            beta[:, :, sl],
            S,
            True,
            mode=mode,
            chunk_size=chunk_size,
        )
        outs.append(o)
        start += n
    assert torch.equal(S0, S0_copy)  # never mutated
    floors, refs = reference(("split", sum(splits)), [q, k, v, g, beta, S0])
    o = torch.cat(outs, dim=2)
    assert_within_noise([o, S], floors, refs, ["chained o", "chained state"])
    names = ["chained o vs one pass", "chained state vs one pass"]
    assert_within_noise([o, S], floors, [o_full, S_full], names, 2 * NOISE_FACTOR)


@pytest.mark.parametrize("time_axis", [False, True])
def test_step_chain_equals_full_sequence(time_axis):
    T = 23
    q, k, v, g, beta, S0 = make_inputs(T, dk=16, dv=8, seed=50)
    floors, refs = reference(("step", T), [q, k, v, g, beta, S0])
    S, outs = S0, []
    for t in range(T):
        sl = slice(t, t + 1) if time_axis else t
        o_t, S_new = gated_delta_step(
            q[:, :, sl], k[:, :, sl], v[:, :, sl], g[:, :, sl], beta[:, :, sl], S
        )
        assert S_new is not S and S_new.dtype == torch.float32
        outs.append(o_t if time_axis else o_t.unsqueeze(2))
        S = S_new
    o = torch.cat(outs, dim=2)
    assert o.shape == (B, H, T, 8)
    assert_within_noise([o, S], floors, refs, ["step-chained o", "step-chained state"])


def test_prefill_then_steps_equals_one_pass():
    T, split = 90, 70
    q, k, v, g, beta, _ = make_inputs(T, seed=51)
    o_pre, S = gated_delta_rule(
        q[:, :, :split],
        k[:, :, :split],
        v[:, :, :split],
        g[:, :, :split],
        beta[:, :, :split],
        None,
        True,
        chunk_size=16,
    )
    outs = [o_pre]
    for t in range(split, T):
        o_t, S = gated_delta_step(q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t], S)
        outs.append(o_t.unsqueeze(2))
    floors, refs = reference(("prefill", T), [q, k, v, g, beta])
    assert_within_noise([torch.cat(outs, dim=2), S], floors, refs, ["o", "state"])


def test_step_without_state_and_bf16():
    q, k, v, g, beta, _ = make_inputs(1, dtype=torch.bfloat16, seed=52)
    o, S = gated_delta_step(q, k, v, g, beta, None)
    floors, (o_ref, S_ref) = noise_floor(_naive, [q, k, v, g, beta])
    assert o.dtype == torch.bfloat16 and o.shape == (B, H, 1, 32) and S.dtype == torch.float32
    assert_close(o, o_ref, BF16_TOL, "o")
    assert_within_noise([S], floors[1:], [S_ref], ["state"])


# ---------------------------------------------------------------------- extremes
@pytest.mark.parametrize("mode,chunk_size", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize(
    "case", ["g=-20", "beta~0", "beta~1", "g=-20,beta~1", "g=0,beta~1", "mixed"]
)
def test_extreme_gates_are_finite_and_correct(mode, chunk_size, case):
    T = 100
    q, k, v, g, beta, S0 = make_inputs(T, seed=60)
    if "g=-20" in case:
        g = torch.full_like(g, -20.0)
    if "g=0" in case:
        g = torch.zeros_like(g)
    if "beta~0" in case:
        beta = torch.full_like(beta, 1e-6)
    if "beta~1" in case:
        beta = torch.full_like(beta, 1 - 1e-6)
    if case == "mixed":  # random spikes of total forgetting and full overwrite
        gen = torch.Generator().manual_seed(61)
        g = torch.where(torch.rand(g.shape, generator=gen) < 0.3, -20.0, g)
        beta = torch.where(torch.rand(g.shape, generator=gen) < 0.3, 1 - 1e-6, beta)
    inputs = [q, k, v, g, beta, S0]
    W = weights(T)
    (floors, refs), (gfloors, g_ref) = reference(("extreme", case), inputs, W)
    outs, g_op = op_grads(inputs, W, mode=mode, chunk_size=chunk_size)
    assert_within_noise(outs, floors, refs, ["o", "final state"])
    assert_within_noise(g_op, gfloors, g_ref, [f"grad {n}" for n in NAMES])


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_large_cumulative_decay_keeps_float32_precision(chunk_size):
    """Bursts of g = -20 for the first half of every chunk push the in-chunk cumulative
    log-decay G to about -20 * chunk_size / 2. exp(G_t - G_j) taken as a difference of two
    such float32 cumsums loses ~|G| * 6e-8 relative (errors ~1e-5 here, far above float32's
    noise on these inputs); summing the segment directly keeps them at round-off."""
    T = 100
    q, k, v, g, beta, S0 = make_inputs(T, seed=60)
    g = torch.where(torch.arange(T) % chunk_size < chunk_size // 2, -20.0, g)
    inputs = [q, k, v, g, beta, S0]
    W = weights(T)
    (floors, refs), (gfloors, g_ref) = reference(("burst", chunk_size), inputs, W)
    outs, g_op = op_grads(inputs, W, chunk_size=chunk_size)
    assert_within_noise(outs, floors, refs, ["o", "final state"])
    assert_within_noise(g_op, gfloors, g_ref, [f"grad {n}" for n in NAMES])


def test_g_minus_20_forgets_the_initial_state():
    """After the first step only exp(-20) of the initial state is left: a 1000x larger one
    changes the outputs by about 1e3 · exp(-20) ≈ 2e-6 relative, and nothing after."""
    q, k, v, g, beta, S0 = make_inputs(3, seed=62)
    g = torch.full_like(g, -20.0)
    o_a, S_a = gated_delta_rule(q, k, v, g, beta, S0, True)
    o_b, S_b = gated_delta_rule(q, k, v, g, beta, 1e3 * S0, True)
    tol = 10 * 1e3 * math.exp(-20)
    assert_close(o_a, o_b, tol, "o")
    assert_close(S_a, S_b, tol, "state")


# ------------------------------------------------------------------ misc contract
def test_output_final_state_false_returns_none_and_zero_length():
    q, k, v, g, beta, S0 = make_inputs(9, seed=70)
    o, S = gated_delta_rule(q, k, v, g, beta, S0)
    assert S is None and o.shape == (B, H, 9, 32)
    for mode in ("chunk", "recurrent"):
        o, S = gated_delta_rule(
            q[:, :, :0], k[:, :, :0], v[:, :, :0], g[:, :, :0], beta[:, :, :0], S0, True, mode=mode
        )
        assert o.shape == (B, H, 0, 32)
        torch.testing.assert_close(S, S0)


def test_padding_does_not_leak_into_final_state():
    # T = chunk_size + 1: the last chunk holds one real step and chunk_size - 1 pad steps.
    # A huge value-carrying neighbour would show up if padding were not an identity.
    q, k, v, g, beta, S0 = make_inputs(17, seed=71)
    floors, refs = reference(("padding", 17), [q, k, v, g, beta, S0])
    o, S = gated_delta_rule(q, k, v, g, beta, S0, True, chunk_size=16)
    assert_within_noise([o, S], floors, refs, ["o", "final state"])


# -------------------------------------------------------------------- bad inputs
def _bad_cases():
    q, k, v, g, beta, S0 = make_inputs(5, seed=80)
    ok = dict(q=q, k=k, v=v, g=g, beta=beta)
    return [
        ("q ndim", dict(ok, q=q[0]), {}, "ndim=3"),
        ("k shape", dict(ok, k=k[:, :, :4]), {}, "(2, 2, 4, 16)"),
        ("v shape", dict(ok, v=v[:1]), {}, "(1, 2, 5, 32)"),
        ("v ndim", dict(ok, v=v[..., 0]), {}, "(2, 2, 5)"),
        ("g shape", dict(ok, g=g[..., None]), {}, "(2, 2, 5, 1)"),
        ("beta shape", dict(ok, beta=beta[:, :1]), {}, "(2, 1, 5)"),
        ("mode", ok, dict(mode="parallel"), "'parallel'"),
        ("chunk_size 0", ok, dict(chunk_size=0), "got 0"),
        ("chunk_size -3", ok, dict(chunk_size=-3), "got -3"),
        ("initial_state", ok, dict(initial_state=S0[..., :7]), "(2, 2, 16, 7)"),
        ("q int", dict(ok, q=q.long()), {}, "torch.int64"),
    ]


@pytest.mark.parametrize("name,tensors,kwargs,needle", _bad_cases(), ids=lambda x: None)
def test_bad_inputs_raise_value_error(name, tensors, kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)) as info:
        gated_delta_rule(**tensors, **kwargs)
    msg = str(info.value)
    assert msg.startswith("gated_delta_rule:")
    if name == "mode":
        assert "'chunk'" in msg and "'recurrent'" in msg
    if name in ("k shape", "v shape", "g shape", "beta shape", "initial_state"):
        assert name.split()[0] in msg


def test_step_bad_inputs():
    q, k, v, g, beta, S0 = make_inputs(2, seed=81)
    with pytest.raises(ValueError, match=re.escape("T=2")):
        gated_delta_step(q, k, v, g, beta, S0)
    q1, k1, v1, g1, b1 = q[:, :, 0], k[:, :, 0], v[:, :, 0], g[:, :, 0], beta[:, :, 0]
    with pytest.raises(ValueError, match=re.escape("(2, 2, 16, 31)")):
        gated_delta_step(q1, k1, v1, g1, b1, S0[..., :31])
    with pytest.raises(ValueError, match=re.escape("g has shape (2,)")):
        gated_delta_step(q1, k1, v1, g1[:, 0], b1, S0)
    with pytest.raises(ValueError, match=re.escape("ndim=2")):
        gated_delta_step(q1[0], k1, v1, g1, b1, S0)
