"""Copy events in text, and the natural far share: how much of a corpus only a copy from beyond
a window predicts.

A **copy event** at position t of a row (the model at t predicts token t + 1): the ``context``
tokens ending at t occurred earlier in the same row, and the token after their most recent
earlier occurrence (ending at j < t) is the token at t + 1. Its **reach** is t − j, the
smallest attention window under which position t attends to the copied token j + 1 (the
convention of :mod:`swax.probes.buckets`: a query at t sees t − W + 1 … t). Because j is the
*most recent* earlier occurrence, a copy event with reach > W has no occurrence inside W.

An event is **only a copy** when a global n-gram model fitted on a training split (the most
frequent next token after the longest context of up to ``context`` tokens seen in training,
"stupid backoff") guesses the target wrong: the copy carries what corpus statistics do not.

The **far share** at (T, W) is the share of all targets of held-out rows of T tokens that are
only-a-copy events with reach > W: the text's own supervision that only a memory reaching
beyond W can use. Its interval is a bootstrap over the held-out documents (each document's
targets resampled together).

Everything here is numpy on token arrays (contexts hashed to 64 bits; a collision is a
1-in-2^64 event per pair), so a corpus of tens of millions of tokens takes seconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import numpy as np

from swax.core.errors import SwaxError

_MULT = np.uint64(0x9E3779B97F4A7C15)
"""Odd 64-bit multiplier of the context hash (Knuth's golden-ratio constant)."""


def context_hashes(tokens: np.ndarray, k: int) -> np.ndarray:
    """uint64 hash of the ``k`` tokens ending at each position (positions < k − 1: 0, never
    matched because :func:`copy_events` and the baseline skip them)."""
    x = np.asarray(tokens).astype(np.uint64) + np.uint64(1)
    h = np.zeros(len(x), np.uint64)
    with np.errstate(over="ignore"):
        for i in range(k):
            h[i:] = h[i:] * _MULT + x[: len(x) - i] if i else x.copy()
        h[: k - 1] = 0
    return h


class NgramBaseline:
    """The global n-gram guess of a training stream: for each context of 1 … ``context``
    tokens seen in training, its most frequent next token (ties: the smallest id). A held-out
    context is answered by the longest order seen in training (stupid backoff); a context not
    seen at any order (an unseen token) gets -1, which is never right."""

    def __init__(self, tokens: np.ndarray, context: int):
        tokens = np.asarray(tokens)
        if context < 1:
            raise SwaxError(f"the n-gram context must be >= 1 token, got {context}")
        self.context = context
        self.tables = []
        nxt = tokens[1:].astype(np.int64)
        for k in range(1, context + 1):
            h = context_hashes(tokens, k)[:-1]
            keep = np.arange(len(h)) >= k - 1
            self.tables.append(_argmax_table(h[keep], nxt[keep]))

    def save(self, path) -> None:
        """Write the tables to ``path`` (.npz, arrays only), atomically."""
        path = Path(path)
        arrays = {"context": np.asarray(self.context)}
        for k, (keys, vals) in enumerate(self.tables, 1):
            arrays[f"keys{k}"], arrays[f"vals{k}"] = keys, vals
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        tmp.replace(path)

    @classmethod
    def load(cls, path) -> NgramBaseline:
        """The baseline :meth:`save` wrote (no pickle); OSError or ValueError if it is not one."""
        with np.load(Path(path), allow_pickle=False) as z:
            out = cls.__new__(cls)
            out.context = int(z["context"])
            out.tables = [(z[f"keys{k}"], z[f"vals{k}"]) for k in range(1, out.context + 1)]
        return out

    @classmethod
    def cached(cls, tokens: np.ndarray, context: int, folder) -> NgramBaseline:
        """The baseline of ``tokens``, read from ``folder`` when an earlier fit of the same
        tokens and context is there (keyed by their SHA-256), else fitted and saved there: the
        same tables either way, without the minutes a fit of a large text takes."""
        tokens = np.ascontiguousarray(tokens)
        digest = hashlib.sha256(tokens.tobytes() + str(tokens.dtype).encode()).hexdigest()[:24]
        path = Path(folder) / f"ngram-{digest}-k{context}.npz"
        if path.is_file():
            try:
                found = cls.load(path)
                if found.context == context:
                    return found
            except (OSError, ValueError, KeyError):
                pass  # a partial or foreign file: fitted again and replaced
        fitted = cls(tokens, context)
        try:
            fitted.save(path)
        except OSError:
            pass  # a read-only cache costs the next run a fit, nothing else
        return fitted

    def predict(self, hashes_by_order: list[np.ndarray]) -> np.ndarray:
        """The guess for each position given its context hash at every order (1 … context),
        as ``hashes_by_order[k - 1]``."""
        n = len(hashes_by_order[0])
        out = np.full(n, -1, np.int64)
        todo = np.ones(n, bool)
        for k in range(self.context, 0, -1):
            keys, vals = self.tables[k - 1]
            h = hashes_by_order[k - 1]
            at = np.searchsorted(keys, h)
            at = np.minimum(at, len(keys) - 1)
            hit = todo & (len(keys) > 0) & (keys[at] == h) if len(keys) else np.zeros(n, bool)
            out[hit] = vals[at[hit]]
            todo &= ~hit
        return out


def _argmax_table(h: np.ndarray, nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique context hashes, the most frequent next token of each)."""
    if not len(h):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    order = np.lexsort((nxt, h))
    h, nxt = h[order], nxt[order]
    new = np.ones(len(h), bool)
    new[1:] = (h[1:] != h[:-1]) | (nxt[1:] != nxt[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(h)))
    uh, un = h[starts], nxt[starts]
    best = np.lexsort((un, -counts, uh))  # by hash, then count (most first), then id
    uh, un = uh[best], un[best]
    first = np.ones(len(uh), bool)
    first[1:] = uh[1:] != uh[:-1]
    return uh[first], un[first]


@dataclasses.dataclass
class CopyEvents:
    """Every target of a set of rows, with its copy event where it has one.

    Arrays have one entry per target (row r, position t predicting token t + 1); ``reach`` is
    0 where the context has no earlier occurrence in the row."""

    row: np.ndarray
    pos: np.ndarray
    reach: np.ndarray
    copy_right: np.ndarray
    only_copy: np.ndarray
    """copy_right and the n-gram baseline wrong (False where no baseline was given)."""


def copy_events(rows: np.ndarray, context: int, baseline: NgramBaseline | None = None):
    """The targets of ``rows`` (R, T + 1) and their copy events (see the module docstring):
    position t of a row predicts token t + 1, so each row has T targets."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[1] < 2:
        raise SwaxError(f"copy events need rows of at least 2 tokens, got shape {rows.shape}")
    R, L = rows.shape
    T = L - 1
    flat = rows.reshape(-1)
    hashes = [context_hashes(flat, k).reshape(R, L)[:, :T] for k in range(1, context + 1)]
    h = hashes[context - 1]
    pos = np.broadcast_to(np.arange(T), (R, T))
    row = np.broadcast_to(np.arange(R)[:, None], (R, T))
    valid = pos >= context - 1  # the context lies inside the row
    # the most recent earlier position with the same context, within the row
    order = np.lexsort((pos.ravel(), h.ravel(), row.ravel()))
    r_s, h_s, p_s, v_s = (
        row.ravel()[order],
        h.ravel()[order],
        pos.ravel()[order],
        valid.ravel()[order],
    )
    same = np.zeros(len(order), bool)
    same[1:] = (r_s[1:] == r_s[:-1]) & (h_s[1:] == h_s[:-1]) & v_s[1:] & v_s[:-1]
    prev = np.full(len(order), -1, np.int64)
    prev[1:] = np.where(same[1:], p_s[:-1], -1)
    earlier = np.full(R * T, -1, np.int64)
    earlier[order] = prev
    earlier = earlier.reshape(R, T)
    has = earlier >= 0
    target = rows[:, 1:]
    copied = np.where(has, np.take_along_axis(rows, np.maximum(earlier, 0) + 1, 1), -1)
    copy_right = has & (copied == target)
    reach = np.where(has, pos - earlier, 0)
    if baseline is not None:
        guess = baseline.predict([x.ravel() for x in hashes]).reshape(R, T)
        only = copy_right & (guess != target)
    else:
        only = np.zeros((R, T), bool)
    return CopyEvents(
        row=row.ravel().copy(),
        pos=pos.ravel().copy(),
        reach=reach.ravel(),
        copy_right=copy_right.ravel(),
        only_copy=only.ravel(),
    )


def split_documents(docs: list, held_out: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """(training, held-out) document indices: a document is held out when the hash of its
    text (with ``seed``) falls below ``held_out``, so the split does not depend on the order."""
    train, held = [], []
    for i, d in enumerate(docs):
        text = d if isinstance(d, str) else repr(d)
        u = int.from_bytes(hashlib.sha256(f"{seed}:{text}".encode()).digest()[:8], "big") / 2**64
        (held if u < held_out else train).append(i)
    return train, held


def stream(token_lists: list[list[int]], eot: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, document index per token): the documents' tokens, each followed by ``eot``."""
    lens = [len(t) + 1 for t in token_lists]
    out = np.empty(sum(lens), np.int64)
    doc = np.repeat(np.arange(len(lens)), lens)
    at = 0
    for t in token_lists:
        out[at : at + len(t)] = t
        out[at + len(t)] = eot
        at += len(t) + 1
    return out, doc


def rows_of(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """Non-overlapping rows of seq_len + 1 tokens (the training rows' shape; the last partial
    row is dropped), as a view-free copy (R, seq_len + 1)."""
    n = (len(tokens) - 1) // seq_len
    if n < 1:
        raise SwaxError(
            f"the held-out text has {len(tokens):,} tokens, fewer than one row of seq_len + 1 = "
            f"{seq_len + 1}"
        )
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return tokens[idx]


def bootstrap_share(num: np.ndarray, den: np.ndarray, samples: int = 1000, seed: int = 0):
    """(share, lo, hi): sum(num) / sum(den) and its 95 % percentile interval from resampling
    the units (documents) with replacement, ``samples`` times."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    total = den.sum()
    share = num.sum() / total if total else math.nan
    if len(num) < 2 or not total:
        return share, math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(num), (samples, len(num)))
    d = den[idx].sum(1)
    s = np.where(d > 0, num[idx].sum(1) / np.maximum(d, 1), np.nan)
    lo, hi = np.nanpercentile(s, [2.5, 97.5])
    return share, float(lo), float(hi)


def far_shares(
    held_rows: np.ndarray,
    row_docs: np.ndarray,
    n_docs: int,
    windows: list[int],
    context: int,
    baseline: NgramBaseline,
    samples: int = 1000,
    seed: int = 0,
) -> list[dict]:
    """Per window W: the far share of ``held_rows`` (R, T + 1) with its bootstrap interval over
    documents (``row_docs`` (R, T): the document of each target), and the counts behind it:
    copy events, only-a-copy events, those beyond W."""
    ev = copy_events(held_rows, context, baseline)
    docs = np.asarray(row_docs).reshape(-1)
    total = np.bincount(docs, minlength=n_docs)
    out = []
    for w in windows:
        far = ev.only_copy & (ev.reach > w)
        per_doc = np.bincount(docs, weights=far, minlength=n_docs)
        share, lo, hi = bootstrap_share(per_doc, total, samples, seed)
        out.append(
            {
                "window": int(w),
                "share": share,
                "ci": [lo, hi],
                "far_events": int(far.sum()),
                "targets": int(total.sum()),
                "copy_events": int(ev.copy_right.sum()),
                "only_copy_events": int(ev.only_copy.sum()),
                "documents": int((total > 0).sum()),
            }
        )
    return out


def natural_far_share(
    docs: list[str],
    tokenizer,
    seq_lens: list[int],
    window_divisors: list[int],
    context: int,
    held_out: float = 0.1,
    samples: int = 1000,
    seed: int = 0,
    progress=None,
) -> dict:
    """The far share of a corpus (see the module docstring) at every (T, W = T / divisor):
    the documents split by hash into a training part (the n-gram baseline) and a held-out part
    (its rows of T tokens are read). ``progress``: called with one line per step."""
    say = progress or (lambda line: None)
    if not 0 < held_out < 1:
        raise SwaxError(f"held_out must be in (0, 1), got {held_out}")
    train_idx, held_idx = split_documents(docs, held_out, seed)
    if not held_idx or not train_idx:
        raise SwaxError(
            f"{len(docs)} document(s) leave no {'held-out' if not held_idx else 'training'} "
            f"part at held_out={held_out}"
        )
    say(f"tokenizing {len(docs):,} documents ({tokenizer.name})")
    train_tok, _ = stream(tokenizer.encode_batch([docs[i] for i in train_idx]), tokenizer.eot_id)
    held_tok, held_doc = stream(
        tokenizer.encode_batch([docs[i] for i in held_idx]), tokenizer.eot_id
    )
    say(f"fitting the {context}-gram baseline on {len(train_tok):,} training tokens")
    baseline = NgramBaseline(train_tok, context)
    out = {
        "tokenizer": tokenizer.name,
        "context": context,
        "held_out": held_out,
        "documents": {"train": len(train_idx), "held_out": len(held_idx)},
        "tokens": {"train": int(len(train_tok)), "held_out": int(len(held_tok))},
        "rows": [],
    }
    for T in seq_lens:
        if len(held_tok) < T + 1:
            say(f"T = {T}: the held-out part has {len(held_tok):,} tokens, skipped")
            continue
        rows = rows_of(held_tok, T)
        n = len(rows)
        row_docs = held_doc[np.arange(n)[:, None] * T + np.arange(T)[None, :]]
        windows = [max(1, T // d) for d in window_divisors]
        say(f"T = {T}: {n:,} held-out rows, windows {windows}")
        res = far_shares(rows, row_docs, len(held_idx), windows, context, baseline, samples, seed)
        for d, r in zip(window_divisors, res):
            r["divisor"] = d
        out["rows"].append({"seq_len": T, "rows": n, "windows": res})
    return out
