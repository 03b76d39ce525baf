"""Copy gain by distance: which memory carries a copy from earlier text, on text alone.

The retrieval probes of :mod:`swax.probes.buckets` read synthetic episodes; this one reads held-
out text. A **copy event** (:mod:`swax.data.copies`) is a target that the token after the most
recent earlier occurrence of its ``context`` preceding tokens predicts and a global n-gram model
does not; its reach r (the window position t needs to see the copied token) puts it in a
distance range. For each event the model's loss on its target is read twice: with the row as it
is, and with **every earlier occurrence** of the context (and the token after it) replaced by
other held-out text of the same length. The **copy gain** is the second loss minus the first:
what the earlier occurrence is worth to the model, in nats.

Three readings per range, as for the episodes: the run's own window, the window **cut** to
W_short (attention cannot reach the earlier occurrence beyond it), and the recurrent state
**reset** right before the predicting position (only attention can carry it). A long window is
lazy on text when its gain beyond W_long is about zero where a short window's is not.

Each gain has a 95 % percentile interval from a **bootstrap over documents** (the held-out
stream's documents, split at its end-of-text tokens, each resampled with all its events): copy
events of one file are not independent. A range **copies** when the interval's lower bound is
above 0; no threshold on the mean. Ranges come from :func:`copy_ranges` (fine ranges between
edges, and pooled ranges up to the training length) or from
:func:`swax.probes.buckets.distance_buckets`.

Events with reach <= context are left out (their earlier occurrence overlaps the context), so a
range at or below ``context`` is empty.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from swax.core.errors import SwaxError
from swax.data.copies import (
    NgramBaseline,
    bootstrap_share,
    context_hashes,
    copy_events,
    rows_of,
)
from swax.probes.episodes import reset_recurrent_state

BOOTSTRAP = 1000
"""Resamples of the documents behind each interval."""


@dataclasses.dataclass(frozen=True)
class CopyRange:
    """Copy events whose reach r satisfies lo < r <= hi, read in rows of ``length`` tokens."""

    label: str
    key: str
    """The label in ASCII, for JSON keys and metric names (r8_32, beyond_64, ...)."""
    lo: int
    hi: int
    length: int
    min_pos: int = 0
    """Only events whose predicting position t is at least this (0: anywhere in the row): the
    reach × position split reads events of reach <= T at positions t >= T, past the training
    length, in rows longer than T."""


def copy_ranges(
    edges: list[int], seq_len: int, pooled: list[int] = (), past: int = 0
) -> list[CopyRange]:
    """Fine ranges (e_i, e_i+1] between increasing ``edges`` (e.g. [8, 32, 64, 128, 256]), each
    read in rows of the training length ``seq_len`` (or of its upper edge, beyond it), then one
    pooled range (p, seq_len] per entry of ``pooled`` that is not already a fine range: "beyond
    W" with the events drawn from the whole stretch, as they occur in the text. With ``past``
    > seq_len, every fine range of reach <= seq_len once more, read at positions t >= seq_len of
    rows of ``past`` tokens (key suffix ``_pastT``): the same reach past the training length,
    which tells length extrapolation from reach."""
    edges = [int(e) for e in edges]
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 1:
        raise SwaxError(f"copy range edges must be >= 1 and increasing, got {edges}")
    out = [
        CopyRange(f"({a}, {b}]", f"r{a}_{b}", a, b, max(seq_len, b))
        for a, b in zip(edges, edges[1:])
    ]
    for p in pooled:
        p = int(p)
        if not 0 <= p < seq_len:
            raise SwaxError(f"a pooled copy range starts below T = {seq_len}, got {p}")
        if any(r.lo == p and r.hi == seq_len for r in out):
            continue
        out.append(CopyRange(f"({p}, T]", f"beyond_{p}", p, seq_len, seq_len))
    if past:
        if past <= seq_len:
            raise SwaxError(f"the past-T rows must be longer than T = {seq_len}, got {past}")
        late = [r for r in out if r.hi <= seq_len and not r.key.startswith("beyond_")]
        for r in late:
            label, key = f"{r.label} at t >= T", f"{r.key}_pastT"
            out.append(dataclasses.replace(r, label=label, key=key, length=past, min_pos=seq_len))
    return out


def document_ids(tokens: np.ndarray, eot: int | None) -> np.ndarray:
    """The document of every token of a stream whose documents each end with ``eot`` (the
    end-of-text token belongs to the document it ends); all 0 when ``eot`` is None."""
    tokens = np.asarray(tokens)
    out = np.zeros(len(tokens), np.int64)
    if eot is not None and len(tokens) > 1:
        out[1:] = np.cumsum(tokens[:-1] == eot)
    return out


def gain_interval(gains, docs, samples: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Mean of per-event ``gains`` and its 95 % percentile interval from resampling the
    documents ``docs`` (one id per event) with replacement; ``copies`` is True when the
    interval's lower bound is above 0. One document gives no interval (NaN)."""
    x = np.asarray(gains, np.float64)
    n = len(x)
    if n == 0:
        return {"mean": math.nan, "ci": [math.nan, math.nan], "n": 0, "docs": 0, "copies": False}
    _, unit = np.unique(np.asarray(docs), return_inverse=True)
    num = np.bincount(unit, weights=x)
    den = np.bincount(unit).astype(np.float64)
    mean, lo, hi = bootstrap_share(num, den, samples, seed)
    return {
        "mean": float(mean),
        "ci": [lo, hi],
        "n": n,
        "docs": int(len(num)),
        "copies": bool(lo > 0),
    }


def replaced_row(
    row: np.ndarray,
    t: int,
    context: int,
    hashes: np.ndarray,
    filler: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """``row`` with every earlier occurrence of the context ending at ``t`` (hashes: the row's
    context hashes) and the token after it replaced by a slice of ``filler`` of the same
    length, drawn at a random place."""
    out = row.copy()
    span = context + 1
    for j in np.flatnonzero(hashes[:t] == hashes[t]):
        if j < context - 1 or j + 1 > t - context:  # not a whole earlier occurrence
            continue
        at = int(rng.integers(len(filler) - span))
        out[j - context + 1 : j + 2] = filler[at : at + span]
    return out


def _occurrences(t: int, context: int, hashes: np.ndarray) -> tuple[list[int], list[tuple]]:
    """(the ends j of the whole earlier occurrences of the context ending at t, which
    :func:`replaced_row` replaces; the spans [start, end) that no placebo edit may touch: every
    occurrence of the context up to t, with the token after it)."""
    found = np.flatnonzero(hashes[: t + 1] == hashes[t])
    whole = [int(j) for j in found if context - 1 <= j and j + 1 <= t - context]
    return whole, [(int(j) - context + 1, int(j) + 2) for j in found]


PLACEBO_SHIFTS = (1, -1, 2, -2, 3, -3)
"""Where a placebo edit goes, in spans of context + 1 tokens from the occurrence it stands for:
just before it (farther from t), else just after it, then two and three spans away."""


def placebo_row(
    row: np.ndarray,
    t: int,
    context: int,
    hashes: np.ndarray,
    filler: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray | None:
    """The placebo of :func:`replaced_row`: ``row`` with as many spans of the same length
    replaced, each at about the distance of the occurrence it stands for (the first of
    :data:`PLACEBO_SHIFTS` that fits) but touching no occurrence of the context: what any edit
    that far back moves. None when an occurrence has no such place in the row."""
    span = context + 1
    whole, avoid = _occurrences(t, context, hashes)
    out, taken = row.copy(), []
    for j in whole:
        start = j - context + 1
        for k in PLACEBO_SHIFTS:
            a, b = start - k * span, start - k * span + span
            if a < 0 or b > t - context + 1 or any(a < e and b > s for s, e in avoid + taken):
                continue
            taken.append((a, b))
            at = int(rng.integers(len(filler) - span))
            out[a:b] = filler[at : at + span]
            break
        else:
            return None
    return out


@torch.no_grad()
def nll_at(model, rows: np.ndarray, pos: np.ndarray, window, reset: bool, batch: int) -> np.ndarray:
    """NLL of token pos + 1 of every row given its tokens up to pos; with ``reset`` the
    recurrent state is emptied right before position pos (rows with the same pos together)."""
    device = model.embed.weight.device
    out = np.empty(len(rows))
    if not reset:
        # rows in order of their position, so that each batch reads only as far as its rows
        # need (about half the tokens of batches in drawing order; the results differ from those
        # only by float32 rounding, as the forward's shapes do)
        order = np.argsort(pos, kind="stable")
        for b in range(0, len(rows), batch):
            sel = order[b : b + batch]
            x = torch.as_tensor(rows[sel], device=device)
            p = torch.as_tensor(pos[sel], device=device)
            keep = int(p.max()) + 1
            logits = model(x[:, :keep], window=window).float()
            lp = torch.log_softmax(logits[torch.arange(len(x)), p], -1)
            out[sel] = -lp.gather(1, x[torch.arange(len(x)), p + 1][:, None])[:, 0].cpu().numpy()
        return out
    for t in np.unique(pos):
        idx = np.flatnonzero(pos == t)
        for b in range(0, len(idx), batch):
            sel = idx[b : b + batch]
            x = torch.as_tensor(rows[sel], device=device)
            state = None
            if t > 0:
                _, state = model(x[:, :t], window=window, return_state=True, logits_to_keep=1)
                state = reset_recurrent_state(model, state)
            logits = model(x[:, t : t + 1], window=window, state=state).float()
            lp = torch.log_softmax(logits[:, -1], -1)
            out[sel] = -lp.gather(1, x[:, t + 1][:, None])[:, 0].cpu().numpy()
    return out


@torch.no_grad()
def row_nlls(model, rows: np.ndarray, window, batch: int) -> np.ndarray:
    """(len(rows), L − 1): the NLL of every token after the first of every row, one forward
    per batch of whole rows (batches of ``batch`` rows of 1,024 tokens or as many tokens)."""
    device = model.embed.weight.device
    L = rows.shape[1]
    step = max(1, batch * 1024 // max(L, 1))
    out = np.empty((len(rows), L - 1))
    for b in range(0, len(rows), step):
        x = torch.as_tensor(rows[b : b + step], device=device)
        lp = torch.log_softmax(model(x, window=window)[:, :-1].float(), -1)
        out[b : b + step] = -lp.gather(-1, x[:, 1:, None])[..., 0].cpu().numpy()
    return out


class _OrigReader:
    """The loss of the events' targets in their rows as they are, for every plan of one
    :func:`copy_gain` call: from whole-row forwards shared by every event of a row (and every
    plan drawn from the same rows) where that reads fewer tokens than one truncated row per
    event, else as :func:`nll_at` does. The two differ by float32 rounding only."""

    def __init__(self, model, batch: int):
        self.model, self.batch, self.rows = model, batch, {}

    def __call__(self, plan, window) -> np.ndarray:
        if plan.all_rows is None:
            return nll_at(self.model, plan.orig, plan.pos, window, False, self.batch)
        cache = self.rows.setdefault((id(plan.all_rows), window), {})
        need = [int(r) for r in np.unique(plan.row_idx) if int(r) not in cache]
        if len(need) * plan.all_rows.shape[1] > int(plan.pos.sum()) + len(plan.pos):
            return nll_at(self.model, plan.orig, plan.pos, window, False, self.batch)
        if need:
            for r, nll in zip(need, row_nlls(self.model, plan.all_rows[need], window, self.batch)):
                cache[r] = nll
        return np.array([cache[int(r)][int(t)] for r, t in zip(plan.row_idx, plan.pos)])


@dataclasses.dataclass
class CopyPlan:
    """The copy events drawn for one range, and their rows as they are and with the earlier
    occurrences replaced: everything about the probe that does not depend on the model (one
    plan serves every checkpoint of a run, and every run on the same text)."""

    row: dict
    """range, key, lo, hi, length, events available and used, documents."""
    pos: np.ndarray
    docs: np.ndarray
    orig: np.ndarray
    repl: np.ndarray
    plac: np.ndarray | None = None
    """The placebo rows (:func:`placebo_row`) of the events that have one (None: no placebo)."""
    plac_idx: np.ndarray | None = None
    """Which events (indices into pos) the placebo rows belong to."""
    row_idx: np.ndarray | None = None
    """Each event's row in ``all_rows``."""
    all_rows: np.ndarray | None = None
    """The held-out rows of this plan's length (shared by the plans of one length)."""


def plan_copy_events(
    tokens: np.ndarray,
    buckets: list,
    baseline: NgramBaseline,
    events: int,
    seed: int = 1234,
    eot: int | None = None,
    cache: dict | None = None,
    placebo: bool = False,
) -> list[CopyPlan]:
    """Per range of ``buckets`` (:func:`copy_ranges` or :func:`distance_buckets`; its
    ``length`` is the row length read): up to ``events`` copy events of held-out ``tokens``
    whose reach lies in the range, drawn with ``seed``, and their rows. ``eot``: the end-of-
    text id that separates the documents of ``tokens``, the units of the bootstrap (None: each
    row is a unit). ``cache``: a dict kept between calls on the same tokens and baseline, where
    the copy events of each row length are found once (they do not depend on ``events``).
    ``placebo``: also the placebo rows (:func:`placebo_row`), drawn with a generator of their
    own, so the events and their replaced rows are those drawn without it."""
    context = baseline.context
    tokens = np.asarray(tokens)
    doc_of = document_ids(tokens, eot)
    out = []
    rng = np.random.default_rng(seed)
    prng = np.random.default_rng([seed, 1])
    by_length = {} if cache is None else cache  # rows, their events and hashes per row length
    for b in buckets:
        if b.length not in by_length:
            rows = rows_of(tokens, b.length)
            hashes = context_hashes(rows.reshape(-1), context).reshape(rows.shape)
            by_length[b.length] = (rows, copy_events(rows, context, baseline), hashes)
        rows, ev, hashes = by_length[b.length]
        ok = ev.only_copy & (ev.reach > max(b.lo, context)) & (ev.reach <= b.hi)
        sel = np.flatnonzero(ok & (ev.pos >= getattr(b, "min_pos", 0)))
        row = {
            "bucket": b.label,
            "key": b.key,
            "lo": b.lo,
            "hi": b.hi,
            "length": b.length,
            "available": int(len(sel)),
        }
        if len(sel) > events:
            sel = np.sort(rng.choice(sel, events, replace=False))
        row["n"] = int(len(sel))
        r_idx, t_idx = ev.row[sel], ev.pos[sel]
        # the document of each event's target (token t + 1 of row r), or its row without eot
        docs = doc_of[r_idx * b.length + t_idx + 1] if eot is not None else r_idx
        row["docs"] = int(len(np.unique(docs)))
        repl = [
            replaced_row(rows[r], t, context, hashes[r], tokens, rng) for r, t in zip(r_idx, t_idx)
        ]
        plan = CopyPlan(row, t_idx, docs, rows[r_idx], np.stack(repl) if repl else rows[:0])
        plan.row_idx, plan.all_rows = r_idx, rows
        if placebo:
            pl = [
                placebo_row(rows[r], t, context, hashes[r], tokens, prng)
                for r, t in zip(r_idx, t_idx)
            ]
            plan.plac_idx = np.array([i for i, x in enumerate(pl) if x is not None], np.int64)
            plan.plac = (
                np.stack([x for x in pl if x is not None]) if len(plan.plac_idx) else rows[:0]
            )
            row["placebo_n"] = int(len(plan.plac_idx))
        out.append(plan)
    return out


def copy_gain(
    model,
    plans: list[CopyPlan],
    window,
    probe_window: int | None = None,
    batch_size: int = 32,
    bootstrap: int = BOOTSTRAP,
    seed: int = 1234,
    probe_keys=None,
    probe_events: int = 0,
) -> list[dict]:
    """The copy gain (nats) of ``model`` on every plan's events with ``window``, with the window
    cut to ``probe_window`` (left out when it equals ``window``) and with the recurrent reset
    (the probes only when probe_window is set, and only on the ranges whose key is in
    ``probe_keys`` when that is given). Each row: the plan's row, the mean loss on the events'
    targets, and the gains with their intervals (:func:`gain_interval`); with placebo rows in the
    plan, the placebo's gain and the gain above it (``placebo``, ``excess``). ``probe_events``
    (0: all): the probes read a random subset of this many of each range's events (the reset
    reads each event's row in a forward of its own)."""
    settings = {"gain": (window, False)}
    if probe_window is not None:
        if probe_window != window:
            settings["window_cut"] = (probe_window, False)
        settings["reset"] = (window, True)
    out, orig = [], _OrigReader(model, batch_size)
    for plan in plans:
        row = dict(plan.row)
        if not row["n"]:
            out.append({**row, "nll": math.nan, "gain": gain_interval([], [])})
            continue
        for name, (w, reset) in settings.items():
            if name != "gain" and probe_keys is not None and row["key"] not in probe_keys:
                continue
            at = plan if name == "gain" else _subset(plan, probe_events, seed)
            a = nll_at(model, at.orig, at.pos, w, True, batch_size) if reset else orig(at, w)
            z = nll_at(model, at.repl, at.pos, w, reset, batch_size)
            g = gain_interval(z - a, at.docs, bootstrap, seed)
            if name == "gain":
                row["nll"] = float(a.mean())
                row["gain"] = g
                if plan.plac is not None:
                    row.update(_placebo(model, plan, a, z, w, batch_size, bootstrap, seed))
            else:
                row.setdefault("probes", {})[name] = g
        out.append(row)
    return out


def _subset(plan: CopyPlan, n: int, seed: int) -> CopyPlan:
    """``plan`` with a random ``n`` of its events (all of them when n is 0 or not fewer)."""
    if not n or n >= len(plan.pos):
        return plan
    keep = np.sort(np.random.default_rng([seed, 2]).choice(len(plan.pos), n, replace=False))
    row = {**plan.row, "probe_n": int(n)}
    return CopyPlan(
        row,
        plan.pos[keep],
        plan.docs[keep],
        plan.orig[keep],
        plan.repl[keep],
        row_idx=plan.row_idx[keep] if plan.row_idx is not None else None,
        all_rows=plan.all_rows,
    )


def _placebo(
    model, plan: CopyPlan, a, z, window, batch_size: int, bootstrap: int, seed: int
) -> dict:
    """The placebo's gain and the copy gain above it (paired per event), with intervals."""
    i = plan.plac_idx
    if not len(i):
        return {"placebo": gain_interval([], []), "excess": gain_interval([], [])}
    p = nll_at(model, plan.plac, plan.pos[i], window, False, batch_size)
    docs = plan.docs[i]
    return {
        "placebo": gain_interval(p - a[i], docs, bootstrap, seed),
        "excess": gain_interval(z[i] - p, docs, bootstrap, seed),
    }


def copy_gain_by_bucket(
    model,
    tokens: np.ndarray,
    buckets: list,
    baseline: NgramBaseline,
    events: int,
    window,
    probe_window: int | None = None,
    seed: int = 1234,
    batch_size: int = 32,
    eot: int | None = None,
    bootstrap: int = BOOTSTRAP,
) -> list[dict]:
    """:func:`plan_copy_events` then :func:`copy_gain`: per range of ``buckets``, up to
    ``events`` copy events of held-out ``tokens`` and the model's copy gain on them with its
    probes and intervals."""
    plans = plan_copy_events(tokens, buckets, baseline, events, seed, eot)
    return copy_gain(model, plans, window, probe_window, batch_size, bootstrap, seed)
