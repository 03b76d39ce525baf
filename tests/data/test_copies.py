"""Copy events and the natural far share (swax.data.copies) against plain-Python references
written here, on random streams small enough to check every position, and on hand-made rows."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from swax.core.errors import SwaxError
from swax.data.copies import (
    NgramBaseline,
    bootstrap_share,
    copy_events,
    far_shares,
    natural_far_share,
    rows_of,
    split_documents,
)


def _naive_baseline(train: list[int], context: int):
    """{context tuple (1 … context tokens): most frequent next token, ties the smallest id}."""
    counts = collections.defaultdict(collections.Counter)
    for k in range(1, context + 1):
        for t in range(k - 1, len(train) - 1):
            counts[tuple(train[t - k + 1 : t + 1])][train[t + 1]] += 1
    return {c: min(n, key=lambda tok: (-n[tok], tok)) for c, n in counts.items()}


def _naive_guess(table, row, t, context):
    for k in range(context, 0, -1):
        if t - k + 1 < 0:
            continue
        g = table.get(tuple(row[t - k + 1 : t + 1]))
        if g is not None:
            return g
    return -1


def _naive_events(rows, context, table):
    out = []
    for r, row in enumerate(rows.tolist()):
        T = len(row) - 1
        for t in range(T):
            reach, right, only = 0, False, False
            if t >= context - 1:
                ctx = row[t - context + 1 : t + 1]
                for j in range(t - 1, context - 2, -1):  # the most recent earlier occurrence
                    if row[j - context + 1 : j + 1] == ctx:
                        reach, right = t - j, row[j + 1] == row[t + 1]
                        break
            if right and table is not None:
                only = _naive_guess(table, row, t, context) != row[t + 1]
            out.append((r, t, reach, right, only))
    return out


@pytest.mark.parametrize("context", [1, 2, 3])
@pytest.mark.parametrize("vocab", [3, 6])
def test_copy_events_match_a_plain_python_reference(context, vocab):
    rng = np.random.default_rng(context * 10 + vocab)
    train = rng.integers(0, vocab, 400)
    rows = rng.integers(0, vocab, (5, 97))
    base = NgramBaseline(train, context)
    ev = copy_events(rows, context, base)
    got = list(
        zip(
            ev.row.tolist(),
            ev.pos.tolist(),
            ev.reach.tolist(),
            ev.copy_right.tolist(),
            ev.only_copy.tolist(),
        )
    )
    want = _naive_events(rows, context, _naive_baseline(train.tolist(), context))
    assert got == want
    assert sum(w[3] for w in want) > 5 and sum(w[4] for w in want) > 0  # the test sees events


def test_the_baseline_backs_off_to_shorter_contexts_and_breaks_ties_by_id():
    base = NgramBaseline(np.array([5, 1, 2, 5, 1, 3, 5, 1, 3, 7, 2]), context=2)
    from swax.data.copies import context_hashes

    def guess(ctx):
        arr = np.array(ctx)
        return int(base.predict([context_hashes(arr, k)[-1:] for k in (1, 2)])[0])

    assert guess([5, 1]) == 3  # 5 1 -> 2 once, -> 3 twice
    assert guess([9, 2]) == 5  # (9, 2) unseen: 2 -> 5 once, -> end-of-stream not counted
    assert guess([0, 7]) == 2
    assert guess([8, 9]) == -1  # nothing known: never right


def test_a_hand_made_row_reads_as_expected():
    # "abcdXabcY abcd": the context "abc" repeats; its most recent occurrence decides
    row = np.array([[1, 2, 3, 4, 9, 1, 2, 3, 8, 9, 1, 2, 3, 4]])
    ev = copy_events(row, 3, None)
    t = 12  # position of the last "3", predicting 4
    assert ev.reach[t] == 12 - 7 and not ev.copy_right[t]  # the last "abc" was followed by 8
    t = 7  # the second "3", predicting 8: the earlier "abc" was followed by 4
    assert ev.reach[t] == 5 and not ev.copy_right[t]
    row2 = np.array([[1, 2, 3, 4, 9, 9, 1, 2, 3, 4]])
    ev2 = copy_events(row2, 3, None)
    assert ev2.reach[8] == 6 and ev2.copy_right[8]


def test_far_shares_count_only_copy_events_beyond_the_window():
    rng = np.random.default_rng(3)
    train = rng.integers(0, 4, 2000)
    rows = rng.integers(0, 4, (6, 65))
    base = NgramBaseline(train, 2)
    docs = np.repeat(np.arange(6), 64).reshape(6, 64)
    res = far_shares(rows, docs, 6, [4, 16], 2, base, samples=50)
    want = _naive_events(rows, 2, _naive_baseline(train.tolist(), 2))
    for w, r in zip((4, 16), res):
        far = sum(1 for _, _, reach, _, only in want if only and reach > w)
        assert r["far_events"] == far and r["targets"] == 6 * 64
        assert r["share"] == pytest.approx(far / (6 * 64))
        assert r["ci"][0] <= r["share"] <= r["ci"][1]


def test_bootstrap_resamples_whole_documents():
    share, lo, hi = bootstrap_share([0, 0, 10], [10, 10, 10], samples=500)
    assert share == pytest.approx(1 / 3)
    assert 0 <= lo < share < hi <= 1
    same = bootstrap_share([1, 1, 1, 1], [10, 10, 10, 10], samples=100)
    assert same == pytest.approx((0.1, 0.1, 0.1))


def test_natural_far_share_on_a_corpus_of_repeated_documents():
    """Documents that repeat a private phrase far apart: the far share at a small window is
    the share of targets inside the phrase's second copy that no n-gram model knows."""

    class Tok:
        name, eot_id, vocab_size = "chars", 0, 200

        def encode_batch(self, texts):
            return [[ord(c) for c in t] for t in texts]

    rng = np.random.default_rng(0)
    docs = []
    for _ in range(60):
        phrase = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 12))
        filler = "".join(rng.choice(list("0123456789"), 100))
        docs.append(phrase + filler + phrase + filler)
    res = natural_far_share(docs, Tok(), [448], [4], context=3, held_out=0.3, samples=50)
    row = res["rows"][0]
    w = row["windows"][0]
    assert w["window"] == 448 // 4 and w["far_events"] > 0
    assert res["documents"]["held_out"] + res["documents"]["train"] == 60
    with pytest.raises(SwaxError, match="held_out must be in"):
        natural_far_share(docs, Tok(), [448], [4], 3, held_out=1.0)


def test_split_and_rows():
    tr, held = split_documents([f"doc {i}" for i in range(200)], 0.25, seed=1)
    assert sorted(tr + held) == list(range(200)) and 25 < len(held) < 80
    assert split_documents(["x", "y"], 0.5, seed=1) == split_documents(["x", "y"], 0.5, seed=1)
    r = rows_of(np.arange(10), 3)
    assert r.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    with pytest.raises(SwaxError, match="fewer than one row"):
        rows_of(np.arange(3), 5)


def test_far_share_command_prints_a_table_and_writes_json(tmp_path, capsys):
    import json

    from swax.cli.main import main

    src = tmp_path / "docs"
    src.mkdir()
    rng = np.random.default_rng(1)
    for i in range(40):
        phrase = "".join(rng.choice(list("abcdefghij"), 10))
        (src / f"{i}.txt").write_text(phrase + " filler text " * 20 + phrase)
    out = tmp_path / "r" / "share.json"
    rc = main(
        [
            "data",
            "far-share",
            str(src),
            "--seq-lens",
            "256",
            "--divisors",
            "8,4",
            "--held-out",
            "0.5",
            "--samples",
            "20",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| 256 | 32 (T/8) |" in printed and "| 256 | 64 (T/4) |" in printed
    res = json.loads(out.read_text())
    assert res["context"] == 8 and res["rows"][0]["seq_len"] == 256
    assert main(["data", "far-share", str(src), "--divisors", "0"]) != 0
    assert "--divisors must be positive" in capsys.readouterr().err


def test_a_cached_baseline_has_the_fitted_tables(tmp_path):
    """NgramBaseline.cached: the first call fits and saves, the second reads the file; both give
    the tables of a fresh fit; a damaged file is fitted again and replaced; other tokens get a
    file of their own."""
    from swax.data.copies import NgramBaseline

    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 20, 5000)
    fresh = NgramBaseline(tokens, 3)
    first = NgramBaseline.cached(tokens, 3, tmp_path)
    (path,) = tmp_path.glob("ngram-*-k3.npz")
    second = NgramBaseline.cached(tokens, 3, tmp_path)
    for got in (first, second):
        assert got.context == 3
        for (k0, v0), (k1, v1) in zip(fresh.tables, got.tables):
            assert np.array_equal(k0, k1) and np.array_equal(v0, v1)
    path.write_bytes(b"not an npz")
    again = NgramBaseline.cached(tokens, 3, tmp_path)
    assert np.array_equal(again.tables[2][0], fresh.tables[2][0])
    assert NgramBaseline.load(path).context == 3  # replaced by a good file
    NgramBaseline.cached(tokens[:4000], 3, tmp_path)
    assert len(list(tmp_path.glob("ngram-*.npz"))) == 2
