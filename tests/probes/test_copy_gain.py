"""The copy-gain probe (swax.probes.copies) against stand-in models whose memory is known by
construction: one that copies only from what its attention window shows (lazy attention) and
one that also remembers everything since its recurrent state was last reset (a memory)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from swax.core.errors import SwaxError
from swax.data.copies import NgramBaseline, context_hashes
from swax.probes.buckets import distance_buckets
from swax.probes.copies import (
    copy_gain_by_bucket,
    copy_ranges,
    document_ids,
    gain_interval,
    replaced_row,
)

CONTEXT = 3
V = 12


@dataclasses.dataclass(frozen=True)
class _State:
    layers: tuple


class Copier:
    """At each position: if the last CONTEXT tokens occurred earlier in what the model can see,
    a confident prediction of the token after their most recent occurrence, else uniform.
    Attention (layer "S") sees the last ``window`` tokens; with ``memory`` a recurrent layer
    ("X") sees everything since its state was last emptied."""

    embed = torch.nn.Embedding(1, 1)

    def __init__(self, memory: bool, vocab: int = V):
        self.memory = memory
        self.vocab = vocab
        self.config = type("C", (), {"layer_types": "SX" if memory else "S", "vocab_size": vocab})

    def __call__(self, x, window=None, state=None, return_state=False, logits_to_keep=None):
        B, T = x.shape
        old = state.layers if state is not None else (None,) * len(self.config.layer_types)
        logits = torch.zeros(B, T, self.vocab)
        seen_all, seen_mem = [], []
        for b in range(B):
            past = list(old[0][b]) if old[0] is not None else []
            mem_past = list(old[-1][b]) if self.memory and old[-1] is not None else []
            ctx, mctx = past + x[b].tolist(), mem_past + x[b].tolist()
            for i in range(T):
                t, mt = len(past) + i, len(mem_past) + i
                lo = 0 if window is None else t - window + 1
                guess = _copy(ctx, t, max(lo, 0))
                if guess is None and self.memory:
                    guess = _copy(mctx, mt, 0)
                if guess is not None:
                    logits[b, i, guess] = 20.0
            seen_all.append(ctx)
            seen_mem.append(mctx)
        layers = (seen_all,) + ((seen_mem,) if self.memory else ())
        new = _State(layers)
        return (logits, new) if return_state else logits


def _copy(seq, t, lo):
    """The token after the most recent earlier occurrence of seq[t-CONTEXT+1 .. t] whose copied
    token lies at or after ``lo``, or None."""
    if t < CONTEXT - 1:
        return None
    key = seq[t - CONTEXT + 1 : t + 1]
    for j in range(t - 1, CONTEXT - 2, -1):
        if j + 1 >= lo and seq[j - CONTEXT + 1 : j + 1] == key:
            return seq[j + 1]
        if j + 1 < lo:
            return None
    return None


def _text(seed=0, n=6000):
    """A stream where random phrases of 6 tokens recur at random distances."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(1, V, 6) for _ in range(12)]
    out = []
    while len(out) < n:
        out.extend(rng.integers(1, V, int(rng.integers(2, 30))).tolist())
        out.extend(phrases[int(rng.integers(len(phrases)))].tolist())
    return np.array(out[:n])


def test_replaced_row_removes_every_earlier_occurrence():
    row = np.array([1, 2, 3, 7, 0, 1, 2, 3, 8, 0, 0, 1, 2, 3, 9])
    h = context_hashes(row, 3)
    filler = np.full(50, 11)
    out = replaced_row(row, 13, 3, h, filler, np.random.default_rng(0))
    assert out[:4].tolist() == [11] * 4 and out[5:9].tolist() == [11] * 4  # both copies gone
    assert out[9:].tolist() == row[9:].tolist()  # the current context is untouched


@pytest.fixture(scope="module")
def setup():
    train, held = _text(0, 20000), _text(1, 6000)
    # the baseline knows the training stream's n-grams; held-out phrases differ by seed
    base = NgramBaseline(train, CONTEXT)
    return held, base, distance_buckets(8, 32, 128, (2,))


def _by(rows):
    return {r["key"]: r for r in rows}


def test_lazy_attention_gains_only_inside_its_window(setup):
    held, base, buckets = setup
    rows = _by(
        copy_gain_by_bucket(
            Copier(memory=False), held, buckets, base, 40, 32, probe_window=8, batch_size=16
        )
    )
    inside, beyond = rows["short_long"], rows["long_T"]
    assert inside["n"] >= 10 and beyond["n"] >= 10
    assert inside["gain"]["ci"][0] > 1.0  # the copy is worth nats inside the window
    assert beyond["gain"]["mean"] == pytest.approx(0.0, abs=1e-6)  # and nothing beyond it
    assert inside["probes"]["window_cut"]["mean"] == pytest.approx(0.0, abs=1e-6)
    assert inside["probes"]["reset"]["mean"] == pytest.approx(inside["gain"]["mean"])


def test_a_memory_gains_beyond_the_window_and_the_reset_removes_it(setup):
    held, base, buckets = setup
    rows = _by(
        copy_gain_by_bucket(
            Copier(memory=True), held, buckets, base, 40, 32, probe_window=8, batch_size=16
        )
    )
    for key in ("long_T", "T_2T"):
        r = rows[key]
        assert r["n"] >= 10, key
        assert r["gain"]["ci"][0] > 1.0, key
        assert r["probes"]["window_cut"]["ci"][0] > 1.0, key  # the memory needs no window
        assert r["probes"]["reset"]["mean"] == pytest.approx(0.0, abs=1e-6), key


# ------------------------------------------------------------------------------ planted copies

BIG_V = 400
EOT = 0


def _planted(seed: int, docs: int = 60, length: int = 300, near: int = 40, far: int = 150):
    """Documents of fresh random tokens (ids 2 … BIG_V − 1, each separated by EOT) in which a
    span of 6 tokens recurs ``near`` tokens later and another ``far`` tokens later: the only
    copy events are those two reaches (up to chance repeats of 3 tokens among 398³)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(docs):
        d = rng.integers(2, BIG_V, length)
        for start, dist in ((10, near), (100, far)):
            d[start + dist : start + dist + 6] = d[start : start + 6]
        out.extend(d.tolist() + [EOT])
    return np.array(out)


@pytest.fixture(scope="module")
def planted():
    base = NgramBaseline(_planted(0), CONTEXT)  # other random text: it never guesses a copy
    return _planted(1), base, copy_ranges([8, 32, 64, 128, 256], 256, pooled=[32])


def test_a_planted_copy_gains_in_its_range_only(planted):
    """A copier that sees 100 tokens back: the copies planted 40 tokens apart are worth what
    the copier's confidence says, by hand (uniform loss ln V minus the copy's loss
    ln(1 + (V − 1)e^−20)); those planted 150 apart, beyond its reach, are worth nothing; the
    ranges where nothing was planted have no events."""
    held, base, ranges = planted
    rows = _by(
        copy_gain_by_bucket(
            Copier(memory=False, vocab=BIG_V), held, ranges, base, 30, 100, batch_size=16, eot=EOT
        )
    )
    hand = math.log(BIG_V) - math.log1p((BIG_V - 1) * math.exp(-20.0))
    near, far = rows["r32_64"], rows["r128_256"]
    assert near["n"] == 30 and far["n"] == 30
    assert near["gain"]["mean"] == pytest.approx(hand, rel=1e-5)
    assert near["gain"]["copies"] and near["gain"]["ci"][0] > 0
    assert near["gain"]["docs"] > 1 and near["docs"] == near["gain"]["docs"]
    assert far["gain"]["mean"] == pytest.approx(0.0, abs=1e-6)
    assert not far["gain"]["copies"] and far["gain"]["ci"][0] <= 0 <= far["gain"]["ci"][1]
    assert rows["r8_32"]["n"] == 0 and rows["r64_128"]["n"] == 0
    # the pooled range (32, T] holds both kinds of events, in the text's own proportion
    pooled = rows["beyond_32"]
    assert pooled["n"] == 30 and 0 < pooled["gain"]["mean"] < hand


def test_a_pure_sliding_window_model_gains_nothing_beyond_its_window(planted):
    """A one-layer SWA model (random weights, window 16) cannot see a token more than 16
    positions back: every range beyond 16 has a gain interval that includes 0."""
    from swax import SwaxConfig, SwaxLM

    held, base, ranges = planted
    torch.manual_seed(0)
    cfg = SwaxConfig(d_model=32, n_layers=1, n_heads=2, layer_pattern="S", vocab_size=BIG_V)
    model = SwaxLM(cfg).eval()
    rows = copy_gain_by_bucket(
        model, held, ranges, base, 30, 16, probe_window=8, batch_size=16, eot=EOT
    )
    read = [r for r in rows if r["n"]]
    assert {r["key"] for r in read} == {"r32_64", "r128_256", "beyond_32"}
    for r in read:
        for g in (r["gain"], r["probes"]["window_cut"], r["probes"]["reset"]):
            assert g["ci"][0] <= 0 <= g["ci"][1], r["key"]
            assert abs(g["mean"]) < 1e-5 and not g["copies"], r["key"]


# ------------------------------------------------------------------------------ the interval


def test_gain_interval_resamples_documents_not_events():
    """Document a: gains 1, 1, 1, 1 (four events); b: 3. The mean is over events (7 / 5); a
    resample of documents moves all of a's events at once, so the interval spans from a's mean
    (1) to b's (3) and nothing outside; one document has no interval."""
    g = gain_interval([1.0, 1.0, 1.0, 1.0, 3.0], ["a", "a", "a", "a", "b"], samples=2000)
    assert g["mean"] == pytest.approx(7 / 5) and g["n"] == 5 and g["docs"] == 2
    lo, hi = g["ci"]
    assert lo == pytest.approx(1.0) and hi == pytest.approx(3.0)
    assert g["copies"]
    one = gain_interval([0.5, 0.7], [4, 4])
    assert one["mean"] == pytest.approx(0.6) and math.isnan(one["ci"][0]) and not one["copies"]
    same = gain_interval([0.2, -0.1, 0.2, -0.1], [0, 0, 1, 1])  # identical documents
    assert same["ci"] == pytest.approx([0.05, 0.05]) and same["copies"]
    empty = gain_interval([], [])
    assert empty["n"] == 0 and not empty["copies"]


def test_document_ids_split_at_end_of_text():
    assert document_ids(np.array([5, 6, 0, 7, 0, 0, 8]), 0).tolist() == [0, 0, 0, 1, 1, 2, 3]
    assert document_ids(np.array([5, 6, 7]), None).tolist() == [0, 0, 0]


def test_copy_ranges_fine_then_pooled():
    r = copy_ranges([8, 32, 64, 128, 256, 1024], 256, pooled=[32, 64, 128])
    assert [x.key for x in r] == [
        "r8_32",
        "r32_64",
        "r64_128",
        "r128_256",
        "r256_1024",
        "beyond_32",
        "beyond_64",
    ]
    assert [x.length for x in r] == [256, 256, 256, 256, 1024, 256, 256]
    assert (r[5].lo, r[5].hi) == (32, 256)
    for bad in ([8], [8, 8], [0, 4], [32, 8]):
        with pytest.raises(SwaxError, match="increasing"):
            copy_ranges(bad, 256)
    with pytest.raises(SwaxError, match="below T"):
        copy_ranges([8, 32], 256, pooled=[256])
