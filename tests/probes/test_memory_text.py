"""Memory on text (issue 59): the copy probe's placebo and its reach × position split, and the
planted passkey, against stand-in models whose reach is known by construction (the ``Copier`` of
test_copy_gain: attention that copies from its window, optionally a memory that copies from
everything since its last reset) and a real one-layer sliding-window model, which cannot see a
token more than W positions back."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from swax import SwaxConfig, SwaxLM
from swax.data import load_tokenizer
from swax.data.copies import NgramBaseline, context_hashes
from swax.probes.copies import copy_gain, copy_ranges, placebo_row, plan_copy_events
from swax.probes.passkey import passkey_retrieval, wilson
from tests.probes.test_copy_gain import BIG_V, CONTEXT, EOT, Copier, _planted, _State


def _by(rows):
    return {r["key"]: r for r in rows}


# ------------------------------------------------------------------------------ the placebo


def test_placebo_row_edits_as_much_as_far_and_no_occurrence():
    """Context 3: the occurrence [1, 2, 3] + 7 at 20..23 and the current one ending at 43. The
    placebo replaces 4 tokens right before the occurrence (16..19: one span farther), nothing
    of the occurrence, and nothing of the current context."""
    row = np.arange(100, 150)
    row[20:24] = [1, 2, 3, 7]
    row[41:45] = [1, 2, 3, 7]
    h = context_hashes(row, 3)
    filler = np.full(60, 5)
    out = placebo_row(row, 43, 3, h, filler, np.random.default_rng(0))
    changed = np.flatnonzero(out != row).tolist()
    assert changed == [16, 17, 18, 19]
    # an occurrence at the start of the row has no room before it: the span goes after it
    row2 = row.copy()
    row2[:4] = [1, 2, 3, 7]
    row2[20:24] = row[20:24] + 50
    out2 = placebo_row(row2, 43, 3, context_hashes(row2, 3), filler, np.random.default_rng(0))
    assert np.flatnonzero(out2 != row2).tolist() == [4, 5, 6, 7]
    # no room anywhere (the occurrence fills what lies before the current context): None
    tight = np.array([1, 2, 3, 7, 1, 2, 3, 7])
    assert (
        placebo_row(tight, 6, 3, context_hashes(tight, 3), filler, np.random.default_rng(0)) is None
    )


@pytest.fixture(scope="module")
def planted():
    base = NgramBaseline(_planted(0), CONTEXT)
    return _planted(1), base


def test_placebo_is_zero_for_a_copier_and_the_gain_counts_above_it(planted):
    """A copier reads only the occurrence: the placebo moves nothing (exactly 0), so the gain
    above the placebo is the gain itself (by hand: ln V − ln(1 + (V − 1)e^−20)) inside its
    reach of 100, and 0 beyond it (the copies planted 150 apart)."""
    held, base = planted
    ranges = copy_ranges([8, 32, 64, 128, 256], 256)
    plans = plan_copy_events(held, ranges, base, 30, eot=EOT, placebo=True)
    rows = _by(copy_gain(Copier(memory=False, vocab=BIG_V), plans, 100, batch_size=16))
    hand = math.log(BIG_V) - math.log1p((BIG_V - 1) * math.exp(-20.0))
    near, far = rows["r32_64"], rows["r128_256"]
    assert near["placebo_n"] == near["n"] == 30
    assert near["placebo"]["mean"] == pytest.approx(0.0, abs=1e-9)
    assert near["excess"]["mean"] == pytest.approx(hand, rel=1e-5) and near["excess"]["copies"]
    assert far["excess"]["mean"] == pytest.approx(0.0, abs=1e-9) and not far["excess"]["copies"]


def test_placebo_of_a_model_blind_beyond_its_window_is_zero_there(planted):
    """A one-layer SWA model (random weights) with window 16 cannot see the placebo's edits,
    placed about as far back as the copies (40 and 150 tokens): placebo and gain are 0 up to
    float32 rounding in both ranges; a model that sees everything (window None) is moved by
    them (each event's loss moves by far more than rounding), which is what the placebo is there
    to measure."""
    held, base = planted
    torch.manual_seed(0)
    cfg = SwaxConfig(d_model=32, n_layers=1, n_heads=2, layer_pattern="S", vocab_size=BIG_V)
    model = SwaxLM(cfg).eval()
    ranges = copy_ranges([32, 64, 128, 256], 256)
    plans = plan_copy_events(held, ranges, base, 20, eot=EOT, placebo=True)
    blind = [r for r in copy_gain(model, plans, 16, batch_size=16) if r["n"]]
    assert {r["key"] for r in blind} == {"r32_64", "r128_256"}
    for r in blind:
        for g in (r["gain"], r["placebo"], r["excess"]):
            assert max(abs(g["mean"]), *map(abs, g["ci"])) < 1e-5 and not g["copies"], r["key"]
    seeing = [r for r in copy_gain(model, plans, None, batch_size=16) if r["n"]]
    assert all(r["placebo"]["ci"][1] - r["placebo"]["ci"][0] > 1e-4 for r in seeing)


# ------------------------------------------------------------------------------ reach × position


def test_past_T_ranges_read_the_same_reach_past_the_training_length(planted):
    """With past = 4T the ranges of reach <= T come again, read in rows of 4T at positions >=
    T only; a memory copies there as well as before T (the same gain, by hand)."""
    held, base = planted
    T = 256
    ranges = copy_ranges([32, 64, 128, 256], T, pooled=[], past=4 * T)
    keys = [r.key for r in ranges]
    assert keys == [
        "r32_64",
        "r64_128",
        "r128_256",
        "r32_64_pastT",
        "r64_128_pastT",
        "r128_256_pastT",
    ]
    late = [r for r in ranges if r.key.endswith("_pastT")]
    assert all(r.length == 4 * T and r.min_pos == T for r in late)
    plans = _by_plan(plan_copy_events(held, ranges, base, 20, eot=EOT))
    assert plans["r32_64_pastT"].pos.min() >= T and plans["r32_64"].pos.max() < T
    rows = _by(copy_gain(Copier(memory=True, vocab=BIG_V), list(plans.values()), 8, batch_size=8))
    hand = math.log(BIG_V) - math.log1p((BIG_V - 1) * math.exp(-20.0))
    for key in ("r32_64", "r32_64_pastT", "r128_256_pastT"):
        assert rows[key]["n"] == 20 and rows[key]["gain"]["mean"] == pytest.approx(hand, rel=1e-5)
    with pytest.raises(Exception, match="longer than T"):
        copy_ranges([32, 64], T, past=T)


def _by_plan(plans):
    return {p.row["key"]: p for p in plans}


# ------------------------------------------------------------------------------ the passkey


class LinearCopier(Copier):
    """The Copier's predictions in one pass per row (a dict of each context's most recent
    occurrence), for rows of thousands of tokens; logits for the last ``logits_to_keep``
    positions only, as SwaxLM returns them."""

    def __call__(self, x, window=None, state=None, return_state=False, logits_to_keep=None):
        B, T = x.shape
        keep = T if logits_to_keep is None else logits_to_keep
        old = state.layers if state is not None else (None,) * len(self.config.layer_types)
        logits = torch.zeros(B, keep, self.vocab)
        layers = [[], []]
        for b in range(B):
            past = list(old[0][b]) if old[0] is not None else []
            mem = list(old[-1][b]) if self.memory and old[-1] is not None else []
            seq, start = past + x[b].tolist(), len(past) - len(mem)  # memory: since start
            last: dict = {}
            for t in range(CONTEXT - 1, len(seq)):
                key = tuple(seq[t - CONTEXT + 1 : t + 1])
                j = last.get(key)
                if t >= len(seq) - keep and j is not None:
                    sees = window is None or t - j <= window
                    if sees or (self.memory and j - CONTEXT + 1 >= start):
                        logits[b, t - (len(seq) - keep), seq[j + 1]] = 20.0
                last[key] = t
            layers[0].append(seq)
            layers[1].append(seq[start:])
        new = _State((layers[0],) + ((layers[1],) if self.memory else ()))
        return (logits, new) if return_state else logits


@pytest.fixture(scope="module")
def haystack():
    """Bytes 128–255 only: no letter, digit, quote or space, so nothing in the haystack looks
    like the key's snippet (a copier finds the key's context nowhere else)."""
    return np.random.default_rng(3).integers(128, 256, 20000)


def test_a_window_copier_retrieves_the_passkey_inside_its_window_only(haystack):
    """A copier whose attention sees W = 100 tokens: the key comes back at distances <= 100
    (a distance d needs a window of d), never beyond; once the whole first key is out of sight
    it is worth nothing; the control (another key first) never comes back;
    the reset changes nothing for attention, and the window cut to 8 loses it."""
    tok = load_tokenizer("byte")
    rows = passkey_retrieval(
        LinearCopier(memory=False, vocab=257),
        haystack,
        tok,
        [32, 99, 100, 101, 130, 400],
        40,
        100,
        probe_window=8,
        seed=0,
        batch_size=20,
    )
    by = {r["distance"]: r for r in rows}
    for d in (32, 99, 100):
        assert by[d]["retrieved"] >= 0.9, d  # a key may repeat 3 of its own hex digits
        assert by[d]["gain"]["ci"][0] > 1.0, d
        assert by[d]["probes"]["reset"]["retrieved"] == by[d]["retrieved"], d
        assert by[d]["probes"]["window_cut"]["retrieved"] == 0.0, d
    for d in (101, 130, 400):
        assert by[d]["retrieved"] == 0.0, d
    for d in (130, 400):  # the whole first key out of sight (at 101 its tail is still in it)
        assert by[d]["gain"]["mean"] == pytest.approx(0.0), d
    assert all(r["control_retrieved"] == 0.0 for r in rows)
    assert by[32]["key_tokens"] == 16 and by[32]["row_tokens"] == 64 + 32 + 7 + 16


def test_a_memory_retrieves_beyond_its_window_and_the_reset_removes_it(haystack):
    tok = load_tokenizer("byte")
    rows = passkey_retrieval(
        LinearCopier(memory=True, vocab=257),
        haystack,
        tok,
        [400, 3000],
        30,
        32,
        probe_window=8,
        seed=1,
        batch_size=30,
    )
    for r in rows:
        assert r["retrieved"] >= 0.9 and r["probes"]["reset"]["retrieved"] == 0.0


def test_a_sliding_window_model_retrieves_no_passkey_beyond_its_window(haystack):
    """A real one-layer SWA model (random weights, window 16): at distances beyond 16 the
    first key is out of sight, so the trial and its control read the same (gain 0 up to
    float32 rounding, the same retrieval)."""
    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig(d_model=32, n_layers=1, n_heads=2, layer_pattern="S")).eval()
    tok = load_tokenizer("byte")
    for r in passkey_retrieval(model, haystack, tok, [32, 256], 10, 16, batch_size=10):
        assert abs(r["gain"]["mean"]) < 1e-5 and r["retrieved"] == r["control_retrieved"]


def test_passkey_bad_input_and_the_interval():
    tok = load_tokenizer("byte")
    hay = np.arange(128, 256).repeat(40)
    with pytest.raises(Exception, match="shorter than the key's snippet"):
        passkey_retrieval(Copier(memory=False, vocab=257), hay, tok, [16], 2, 8)
    with pytest.raises(Exception, match="trials must be >= 1"):
        passkey_retrieval(Copier(memory=False, vocab=257), hay, tok, [64], 0, 8)
    # Wilson's interval by hand: 0 of 20 -> [0, z²/(n + z²)]; 10 of 20 centred on 0.5
    lo, hi = wilson(0, 20)
    z2 = 1.959964**2
    assert lo == 0.0 and hi == pytest.approx(z2 / (20 + z2))
    lo, hi = wilson(10, 20)
    assert (lo + hi) / 2 == pytest.approx(0.5) and hi - lo == pytest.approx(
        2 * math.sqrt(z2 * (0.25 / 20 + z2 / 1600)) / (1 + z2 / 20)
    )


def test_the_shared_whole_row_losses_equal_the_truncated_rows():
    """Where many events share rows, copy_gain reads their unedited rows once, whole (the
    _OrigReader); the losses must equal the truncated-row reading up to float32 rounding (a
    few ulp of each loss through two layers: 1e-5 relative is 80 ulp)."""
    from swax.probes.copies import _OrigReader, nll_at

    rng = np.random.default_rng(0)
    phrase = rng.integers(1, 50, 12)
    stream = []
    while len(stream) < 4096:
        stream += rng.integers(1, 50, int(rng.integers(3, 100))).tolist() + phrase.tolist()
    stream = np.array(stream[:4096])
    base = NgramBaseline(np.random.default_rng(1).integers(1, 50, 5000), CONTEXT)
    plans = plan_copy_events(stream[:2048], copy_ranges([8, 32, 128], 128), base, 60)
    assert all(p.row["n"] >= 30 for p in plans), [p.row["n"] for p in plans]
    torch.manual_seed(0)
    model = SwaxLM(SwaxConfig(d_model=32, n_layers=2, n_heads=2, layer_pattern="SX")).eval()
    reader = _OrigReader(model, 8)
    for plan in plans:
        shared = reader(plan, 16)
        truncated = nll_at(model, plan.orig, plan.pos, 16, False, 8)
        np.testing.assert_allclose(shared, truncated, rtol=1e-5)
    assert reader.rows  # the whole rows were read (and shared by both plans)


def test_the_probes_read_a_random_subset_when_asked(planted):
    """probe_events = 10: the window cut and the reset read 10 of the range's 30 events, with
    the values a copier gives them by hand."""
    held, base = planted
    plans = plan_copy_events(held, copy_ranges([32, 64], 256), base, 30, eot=EOT)
    model = Copier(memory=False, vocab=BIG_V)
    row = copy_gain(model, plans, 100, probe_window=8, batch_size=16, probe_events=10)[0]
    hand = math.log(BIG_V) - math.log1p((BIG_V - 1) * math.exp(-20.0))
    assert row["gain"]["n"] == 30 and row["probes"]["reset"]["n"] == 10
    assert row["probes"]["reset"]["mean"] == pytest.approx(hand, rel=1e-5)
    assert row["probes"]["window_cut"]["n"] == 10
    assert row["probes"]["window_cut"]["mean"] == pytest.approx(0.0, abs=1e-9)
