"""The copy-gain probe (swax.probes.copies) against stand-in models whose memory is known by
construction: one that copies only from what its attention window shows (lazy attention) and
one that also remembers everything since its recurrent state was last reset (a memory)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from swax.data.copies import NgramBaseline, context_hashes
from swax.probes.buckets import distance_buckets
from swax.probes.copies import copy_gain_by_bucket, replaced_row

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

    def __init__(self, memory: bool):
        self.memory = memory
        self.config = type("C", (), {"layer_types": "SX" if memory else "S", "vocab_size": V})

    def __call__(self, x, window=None, state=None, return_state=False, logits_to_keep=None):
        B, T = x.shape
        old = state.layers if state is not None else (None,) * len(self.config.layer_types)
        logits = torch.zeros(B, T, V)
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
    rows = _by(copy_gain_by_bucket(Copier(memory=False), held, buckets, base, 40, 32,
                                   probe_window=8, batch_size=16))  # fmt: skip
    inside, beyond = rows["short_long"], rows["long_T"]
    assert inside["n"] >= 10 and beyond["n"] >= 10
    assert inside["gain"]["ci"][0] > 1.0  # the copy is worth nats inside the window
    assert beyond["gain"]["mean"] == pytest.approx(0.0, abs=1e-6)  # and nothing beyond it
    assert inside["probes"]["window_cut"]["mean"] == pytest.approx(0.0, abs=1e-6)
    assert inside["probes"]["reset"]["mean"] == pytest.approx(inside["gain"]["mean"])


def test_a_memory_gains_beyond_the_window_and_the_reset_removes_it(setup):
    held, base, buckets = setup
    rows = _by(copy_gain_by_bucket(Copier(memory=True), held, buckets, base, 40, 32,
                                   probe_window=8, batch_size=16))  # fmt: skip
    for key in ("long_T", "T_2T"):
        r = rows[key]
        assert r["n"] >= 10, key
        assert r["gain"]["ci"][0] > 1.0, key
        assert r["probes"]["window_cut"]["ci"][0] > 1.0, key  # the memory needs no window
        assert r["probes"]["reset"]["mean"] == pytest.approx(0.0, abs=1e-6), key
