"""Copy gain by distance: which memory carries a copy from earlier text, on text alone.

The retrieval probes of :mod:`swax.probes.buckets` read synthetic episodes; this one reads held-
out text. A **copy event** (:mod:`swax.data.copies`) is a target that the token after the most
recent earlier occurrence of its ``context`` preceding tokens predicts and a global n-gram model
does not; its reach r (the window position t needs to see the copied token) puts it in a
distance bucket. For each event the model's loss on its target is read twice: with the row as it
is, and with **every earlier occurrence** of the context (and the token after it) replaced by
other held-out text of the same length. The **copy gain** is the second loss minus the first:
what the earlier occurrence is worth to the model, in nats.

Three readings per bucket, as for the episodes: the run's own window, the window **cut** to
W_short (attention cannot reach the earlier occurrence beyond it), and the recurrent state
**reset** right before the predicting position (only attention can carry it). A long window is
lazy on text when its gain beyond W_long is about zero where a short window's is not.

Events with reach <= context are left out (their earlier occurrence overlaps the context), so a
bucket at or below ``context`` is empty.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from swax.data.copies import NgramBaseline, context_hashes, copy_events, rows_of
from swax.probes.episodes import reset_recurrent_state


def _gain(a: list[float]) -> dict:
    """Mean, its 95 % normal interval and n of per-event gains."""
    x = np.asarray(a, np.float64)
    n = len(x)
    if n == 0:
        return {"mean": math.nan, "ci": [math.nan, math.nan], "n": 0}
    m = float(x.mean())
    h = 1.96 * float(x.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    return {"mean": m, "ci": [m - h, m + h], "n": n}


def replaced_row(row: np.ndarray, t: int, context: int, hashes: np.ndarray, filler: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:  # fmt: skip
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


@torch.no_grad()
def _nll_at(
    model, rows: np.ndarray, pos: np.ndarray, window, reset: bool, batch: int
) -> np.ndarray:
    """NLL of token pos + 1 of every row given its tokens up to pos; with ``reset`` the
    recurrent state is emptied right before position pos (rows with the same pos together)."""
    device = model.embed.weight.device
    out = np.empty(len(rows))
    if not reset:
        for b in range(0, len(rows), batch):
            x = torch.as_tensor(rows[b : b + batch], device=device)
            p = torch.as_tensor(pos[b : b + batch], device=device)
            keep = int(p.max()) + 1
            logits = model(x[:, :keep], window=window).float()
            lp = torch.log_softmax(logits[torch.arange(len(x)), p], -1)
            out[b : b + batch] = (
                -lp.gather(1, x[torch.arange(len(x)), p + 1][:, None])[:, 0].cpu().numpy()
            )
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
) -> list[dict]:
    """Per bucket of :func:`swax.probes.buckets.distance_buckets` (its ``length`` is the row
    length read): up to ``events`` copy events of held-out ``tokens`` whose reach lies in the
    bucket, drawn with ``seed``, and the copy gain (nats) with ``window``, with the window cut to
    ``probe_window`` and with the recurrent reset (the probes only when probe_window is set).
    Each row: bucket, lo, hi, length, events available and used, the mean loss on the events'
    targets, and the gains with 95 % intervals."""
    context = baseline.context
    tokens = np.asarray(tokens)
    out = []
    rng = np.random.default_rng(seed)
    for b in buckets:
        rows = rows_of(tokens, b.length)
        ev = copy_events(rows, context, baseline)
        sel = np.flatnonzero(ev.only_copy & (ev.reach > max(b.lo, context)) & (ev.reach <= b.hi))
        row = {"bucket": b.label, "key": b.key, "lo": b.lo, "hi": b.hi, "length": b.length,
               "available": int(len(sel))}  # fmt: skip
        if len(sel) > events:
            sel = np.sort(rng.choice(sel, events, replace=False))
        row["n"] = int(len(sel))
        if not len(sel):
            out.append({**row, "nll": math.nan, "gain": _gain([])})
            continue
        r_idx, t_idx = ev.row[sel], ev.pos[sel]
        hashes = context_hashes(rows.reshape(-1), context).reshape(rows.shape)
        filler = tokens
        orig = rows[r_idx]
        repl = np.stack(
            [
                replaced_row(rows[r], t, context, hashes[r], filler, rng)
                for r, t in zip(r_idx, t_idx)
            ]
        )
        settings = {"gain": (window, False)}
        if probe_window is not None:
            settings.update(window_cut=(probe_window, False), reset=(window, True))
        for name, (w, reset) in settings.items():
            a = _nll_at(model, orig, t_idx, w, reset, batch_size)
            z = _nll_at(model, repl, t_idx, w, reset, batch_size)
            if name == "gain":
                row["nll"] = float(a.mean())
                row["gain"] = _gain(list(z - a))
            else:
                row.setdefault("probes", {})[name] = _gain(list(z - a))
        out.append(row)
    return out
