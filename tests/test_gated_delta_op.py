"""Tests for swax.ops.gated_delta against an independent float64 reference.

The reference below is a per-step transcription of fla's
``naive_recurrent_gated_delta_rule`` (fla/ops/gated_delta_rule/naive.py), written here and
run in float64; nothing from swax is used to build expected values.

Tolerances (errors are max |actual - expected| / max(1, max |expected|)):

- float64 inputs: 1e-12. The chunk form is an exact algebraic rewrite of the recurrence,
  so it must agree to round-off (observed <= 8e-16).
- float32 forward: 1e-5. Values are O(1) (unit-norm q, k; beta < 1 makes each step a
  contraction, so |S| stays O(|v|)); float32 round-off is ~6e-8 per op and the chunk
  form adds a 64x64 unit-triangular solve; observed <= ~4e-7, so 1e-5 leaves ~25x margin;
  deliberate bugs (masks, decay placement, chunk order, padding, scale) all fail it.
- float32 gradients: 2e-5. Backward chains more matmuls through the solve and sums over T
  for g and beta; observed <= ~8e-7.
- bfloat16 inputs: 3e-2 on o and input gradients. The reference sees the same bf16-rounded
  inputs; what remains is rounding o and the gradients to bf16 (2^-9 relative; observed
  <= 6e-3). The float32 final state keeps the float32 tolerance.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from swax.ops.gated_delta import gated_delta_rule, gated_delta_step

B, H = 2, 2
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 3e-2}
GRAD_TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2}
CONFIGS = [("recurrent", 64), ("chunk", 64), ("chunk", 16)]
CONFIG_IDS = ["recurrent", "chunk64", "chunk16"]


# --------------------------------------------------------------------------- reference
def naive_gated_delta(q, k, v, g, beta, initial_state=None, scale=None):
    """fla's naive_recurrent_gated_delta_rule in (B, H, T, D) layout, float64."""
    q, k, v, g, beta = (x.to(torch.float64) for x in (q, k, v, g, beta))
    b, h, T, dk = q.shape
    dv = v.shape[-1]
    if scale is None:
        scale = dk**-0.5
    S = torch.zeros(b, h, dk, dv, dtype=torch.float64)
    if initial_state is not None:
        S = initial_state.to(torch.float64)
    q = q * scale
    o = []
    for i in range(T):
        S = S * g[:, :, i].exp()[..., None, None]
        b_v = v[:, :, i] - (S * k[:, :, i][..., None]).sum(-2)
        b_v = b_v * beta[:, :, i][..., None]
        S = S + k[:, :, i].unsqueeze(-1) * b_v.unsqueeze(-2)
        o.append(torch.einsum("bhd,bhdm->bhm", q[:, :, i], S))
    o = torch.stack(o, dim=2) if o else torch.zeros(b, h, 0, dv, dtype=torch.float64)
    return o, S


def make_inputs(T, dk=16, dv=32, dtype=torch.float32, seed=0, gate="softplus", b=B, h=H):
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = F.normalize(rn(b, h, T, dk), dim=-1)
    k = F.normalize(rn(b, h, T, dk), dim=-1)
    v = rn(b, h, T, dv)
    if gate == "softplus":
        g = -F.softplus(rn(b, h, T))
    else:
        g = F.logsigmoid(rn(b, h, T) + 2.0)
    beta = torch.sigmoid(rn(b, h, T))
    S0 = 0.5 * rn(b, h, dk, dv)
    return [x.to(dtype) for x in (q, k, v, g, beta)] + [S0.to(torch.float32)]


def err(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if expected.numel() == 0:
        return 0.0
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1.0)).item()


def assert_close(actual, expected, tol, what):
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    e = err(actual, expected)
    assert e <= tol, f"{what}: error {e:.3e} > tol {tol:.1e}"


def loss_weights(T, dk, dv, seed=123):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, T, dv, generator=gen, dtype=torch.float64),
        torch.randn(B, H, dk, dv, generator=gen, dtype=torch.float64),
    )


def grads_of(fn, inputs, wo, ws):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    o, S = fn(*leaves)
    loss = (o.double() * wo).sum() + (S.double() * ws).sum()
    return o, S, torch.autograd.grad(loss, leaves)


NAMES = ["q", "k", "v", "g", "beta", "initial_state"]
_REFERENCE_CACHE: dict = {}


def reference(key, inputs, wo=None, ws=None):
    """Float64 naive outputs (and gradients if weights are given), cached by key: the same
    inputs are shared by the parametrisations over modes, and the Python loop is slow."""
    if key not in _REFERENCE_CACHE:
        xs = [x.double() for x in inputs]
        if wo is None:
            _REFERENCE_CACHE[key] = naive_gated_delta(*xs)
        else:
            _REFERENCE_CACHE[key] = grads_of(naive_gated_delta, xs, wo, ws)
    return _REFERENCE_CACHE[key]


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
    o_ref, S_ref = reference(("fwd", T), [q, k, v, g, beta, S0])
    o, S = gated_delta_rule(q, k, v, g, beta, S0, True, mode=mode, chunk_size=chunk_size)
    assert o.dtype == torch.float32 and S.dtype == torch.float32
    assert o.shape == (B, H, T, 32) and S.shape == (B, H, 16, 32)
    assert_close(o, o_ref, TOL[torch.float32], "o")
    assert_close(S, S_ref, TOL[torch.float32], "final state")
    # also without an initial state
    o_ref, S_ref = reference(("fwd-no-state", T), [q, k, v, g, beta])
    o, S = gated_delta_rule(q, k, v, g, beta, None, True, mode=mode, chunk_size=chunk_size)
    assert_close(o, o_ref, TOL[torch.float32], "o (no initial state)")
    assert_close(S, S_ref, TOL[torch.float32], "final state (no initial state)")


@pytest.mark.parametrize("T", [1, 7, 64, 100, 200])
@pytest.mark.parametrize("chunk_size", [64, 16, 5])
def test_chunk_algebra_exact_in_float64(T, chunk_size):
    q, k, v, g, beta, S0 = make_inputs(T, dtype=torch.float64, seed=T + 1, gate="logsigmoid")
    o_ref, S_ref = naive_gated_delta(q, k, v, g, beta, S0)
    o, S = gated_delta_rule(q, k, v, g, beta, S0.double(), True, chunk_size=chunk_size)
    assert o.dtype == torch.float64
    assert_close(o, o_ref, TOL[torch.float64], "o")
    assert_close(S, S_ref, TOL[torch.float64], "final state")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_dk_larger_than_dv_and_custom_scale(mode):
    q, k, v, g, beta, S0 = make_inputs(37, dk=32, dv=8, seed=3)
    o_ref, S_ref = naive_gated_delta(q, k, v, g, beta, S0, scale=0.7)
    o, S = gated_delta_rule(q, k, v, g, beta, S0, True, mode=mode, chunk_size=16, scale=0.7)
    assert o.shape == (B, H, 37, 8) and S.shape == (B, H, 32, 8)
    assert_close(o, o_ref, TOL[torch.float32], "o")
    assert_close(S, S_ref, TOL[torch.float32], "final state")


# ----------------------------------------------------------------------- gradients
@pytest.mark.parametrize("T", [1, 7, 64, 100, 200])
@pytest.mark.parametrize("mode,chunk_size", CONFIGS, ids=CONFIG_IDS)
def test_gradients_match_naive_float32(T, mode, chunk_size):
    inputs = make_inputs(T, seed=10 + T)
    wo, ws = loss_weights(T, 16, 32)
    _, _, g_ref = reference(("grad", T), inputs, wo, ws)

    def op(*xs):
        return gated_delta_rule(*xs, output_final_state=True, mode=mode, chunk_size=chunk_size)

    _, _, g_op = grads_of(op, inputs, wo, ws)
    for name, a, e in zip(NAMES, g_op, g_ref):
        assert a.dtype == torch.float32
        assert_close(a, e, GRAD_TOL[torch.float32], f"grad {name}")


@pytest.mark.parametrize("T", [7, 100])
@pytest.mark.parametrize("chunk_size", [64, 16])
def test_chunk_matches_recurrent_forward_and_backward(T, chunk_size):
    inputs = make_inputs(T, dk=24, dv=16, seed=20 + T)
    wo, ws = loss_weights(T, 24, 16)

    def run(mode):
        def op(*xs):
            return gated_delta_rule(*xs, output_final_state=True, mode=mode, chunk_size=chunk_size)

        return grads_of(op, inputs, wo, ws)

    o_c, S_c, g_c = run("chunk")
    o_r, S_r, g_r = run("recurrent")
    assert_close(o_c, o_r, TOL[torch.float32], "o")
    assert_close(S_c, S_r, TOL[torch.float32], "final state")
    for name, a, e in zip(NAMES, g_c, g_r):
        assert_close(a, e, GRAD_TOL[torch.float32], f"grad {name}")


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
    wo, ws = loss_weights(T, 16, 32)
    o_ref, S_ref, g_ref = reference(("bf16", T), inputs, wo, ws)

    def op(*xs):
        return gated_delta_rule(*xs, output_final_state=True, mode=mode, chunk_size=chunk_size)

    o, S, g_op = grads_of(op, inputs, wo, ws)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert_close(o, o_ref, TOL[torch.bfloat16], "o")
    # the state is float32 math on the same (bf16-valued) inputs: float32 tolerance
    assert_close(S, S_ref, TOL[torch.float32], "final state")
    for name, a, e in zip(NAMES, g_op, g_ref):
        assert a.dtype == inputs[NAMES.index(name)].dtype
        assert_close(a, e, GRAD_TOL[torch.bfloat16], f"grad {name}")


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
    torch.testing.assert_close(S0, S0_copy, rtol=0, atol=0)  # never mutated
    assert_close(torch.cat(outs, dim=2), o_full, TOL[torch.float32], "chained o")
    assert_close(S, S_full, TOL[torch.float32], "chained state")
    o_ref, S_ref = naive_gated_delta(q, k, v, g, beta, S0)
    assert_close(S, S_ref, TOL[torch.float32], "chained state vs naive")


@pytest.mark.parametrize("time_axis", [False, True])
def test_step_chain_equals_full_sequence(time_axis):
    T = 23
    q, k, v, g, beta, S0 = make_inputs(T, dk=16, dv=8, seed=50)
    o_ref, S_ref = naive_gated_delta(q, k, v, g, beta, S0)
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
    assert_close(o, o_ref, TOL[torch.float32], "step-chained o")
    assert_close(S, S_ref, TOL[torch.float32], "step-chained state")


def test_prefill_then_steps_equals_one_pass():
    T, split = 90, 70
    q, k, v, g, beta, _ = make_inputs(T, seed=51)
    o_full, S_full = gated_delta_rule(q, k, v, g, beta, None, True, chunk_size=16)
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
    assert_close(torch.cat(outs, dim=2), o_full, TOL[torch.float32], "o")
    assert_close(S, S_full, TOL[torch.float32], "state")


def test_step_without_state_and_bf16():
    q, k, v, g, beta, _ = make_inputs(1, dtype=torch.bfloat16, seed=52)
    o, S = gated_delta_step(q, k, v, g, beta, None)
    o_ref, S_ref = naive_gated_delta(q, k, v, g, beta)
    assert o.dtype == torch.bfloat16 and o.shape == (B, H, 1, 32) and S.dtype == torch.float32
    assert_close(o, o_ref, TOL[torch.bfloat16], "o")
    assert_close(S, S_ref, TOL[torch.float32], "state")


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
    wo, ws = loss_weights(T, 16, 32)
    o_ref, S_ref, g_ref = reference(("extreme", case), inputs, wo, ws)

    def op(*xs):
        return gated_delta_rule(*xs, output_final_state=True, mode=mode, chunk_size=chunk_size)

    o, S, g_op = grads_of(op, inputs, wo, ws)
    assert_close(o, o_ref, TOL[torch.float32], "o")
    assert_close(S, S_ref, TOL[torch.float32], "final state")
    for name, a, e in zip(NAMES, g_op, g_ref):
        assert_close(a, e, GRAD_TOL[torch.float32], f"grad {name}")


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_large_cumulative_decay_keeps_float32_precision(chunk_size):
    """Bursts of g = -20 for the first half of every chunk push the in-chunk cumulative
    log-decay G to about -20 * chunk_size / 2. exp(G_t - G_j) taken as a difference of two
    such float32 cumsums loses ~|G| * 6e-8 relative (errors ~1e-5 here); summing the segment
    directly keeps them at round-off (observed <= 4e-7), hence the tighter tolerance."""
    T = 100
    q, k, v, g, beta, S0 = make_inputs(T, seed=60)
    g = torch.where(torch.arange(T) % chunk_size < chunk_size // 2, -20.0, g)
    inputs = [q, k, v, g, beta, S0]
    wo, ws = loss_weights(T, 16, 32)
    o_ref, S_ref, g_ref = reference(("burst", chunk_size), inputs, wo, ws)

    def op(*xs):
        return gated_delta_rule(*xs, output_final_state=True, chunk_size=chunk_size)

    o, S, g_op = grads_of(op, inputs, wo, ws)
    assert_close(o, o_ref, 3e-6, "o")
    assert_close(S, S_ref, 3e-6, "final state")
    for name, a, e in zip(NAMES, g_op, g_ref):
        assert_close(a, e, 3e-6, f"grad {name}")


def test_g_minus_20_forgets_the_initial_state():
    q, k, v, g, beta, S0 = make_inputs(3, seed=62)
    g = torch.full_like(g, -20.0)
    o_a, S_a = gated_delta_rule(q, k, v, g, beta, S0, True)
    o_b, S_b = gated_delta_rule(q, k, v, g, beta, 1e3 * S0, True)
    assert_close(o_a, o_b, 1e-4, "o")
    assert_close(S_a, S_b, 1e-4, "state")


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
    o_ref, S_ref = naive_gated_delta(q, k, v, g, beta, S0)
    o, S = gated_delta_rule(q, k, v, g, beta, S0, True, chunk_size=16)
    assert_close(S, S_ref, TOL[torch.float32], "final state")
    assert_close(o, o_ref, TOL[torch.float32], "o")


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
