"""Recall by distance bucket: where an answer sits relative to the windows, and which memory
carries it. The laziness study's metric, ``swax eval recall``'s table and the training monitor.

An answer's **reach** is the smallest attention window under which the position that predicts
it attends to its value (:attr:`swax.data.episode.Episode.reaches`): it is *inside* window W
when reach <= W. A run with windows W_short < W_long trained at length T is read in buckets
of reach

    <= W_short,  (W_short, W_long],  (W_long, T],  (T, 4T],  (4T, 16T]

Each bucket draws its own episodes with the nearest answer's reach uniform in the bucket, at the
training length T for buckets up to T and at the bucket's upper edge beyond it, so every bucket
has its count n (and a Wilson interval on its recall). Two probes per bucket tell which memory
carries the answers: the sliding window **cut** to W_short (attention cannot see a value beyond
it) and the recurrent state **reset** right before the question (only attention can carry it).

A run is **lazy** when it recalls >= 90 % inside W_long and at most 10 points above chance in
(W_long, T]: attention answers what it sees and the recurrent memory nothing.
"""

from __future__ import annotations

import dataclasses
import math

from swax.core.errors import SwaxError
from swax.data.config import SyntheticConfig
from swax.probes.episodes import episode_accuracy

LAZY_INSIDE = 90.0
"""Recall (%) inside W_long at or above which a run that fails beyond it is lazy."""
LAZY_MARGIN = 10.0
"""Points above chance in (W_long, T] at or below which recall there counts as none."""
LEARNED = 50.0
"""Recall (%) that counts as learned in a bucket."""


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Answers whose reach r satisfies lo < r <= hi, drawn in episodes of ``length`` tokens."""

    label: str
    key: str
    """The label in ASCII, for metric names (le_short, short_long, long_T, T_4T, 4T_16T)."""
    lo: int
    hi: int
    length: int
    inside_long: bool
    """Whether the bucket lies inside the long window (attention with W_long can serve it)."""


def distance_buckets(short: int, long: int, seq_len: int, far: tuple[int, ...] = (4, 16)) -> list:
    """The buckets of a run with windows ``short`` <= ``long`` trained at ``seq_len``
    (empty ones, where two edges meet, are left out)."""
    edges = [
        ("≤W_short", "le_short", short),
        ("(W_short, W_long]", "short_long", long),
        ("(W_long, T]", "long_T", seq_len),
    ]
    prev = ["T"] + [f"{m}T" for m in far]
    edges += [(f"({prev[i]}, {m}T]", f"{prev[i]}_{m}T", m * seq_len) for i, m in enumerate(far)]
    out, lo = [], 0
    for label, key, hi in edges:
        if hi > lo:
            length = seq_len if hi <= seq_len else hi
            out.append(Bucket(label, key, lo, hi, length, hi <= long))
            lo = hi
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial share k / n, in %."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (100 * max(0.0, c - h), 100 * min(1.0, c + h))


def _tally(answers: list, lo: int, hi: int) -> dict:
    mine = [a for a in answers if lo < a[0] <= hi]
    k, n = sum(int(a[1]) for a in mine), len(mine)
    return {
        "acc": 100.0 * k / n if n else math.nan,
        "correct": k,
        "n": n,
        "ci": list(wilson(k, n)),
        "nll": sum(a[2] for a in mine) / n if n else math.nan,
    }


def recall_by_bucket(
    model,
    tokenizer,
    haystack,
    cfg: SyntheticConfig,
    buckets: list[Bucket],
    samples: int,
    window,
    probe_window: int | None = None,
    seed: int = 1234,
    batch_size: int = 16,
    progress: bool = False,
) -> list[dict]:
    """Per bucket: recall with ``window`` (n, Wilson interval, answer nll) and, unless
    ``probe_window`` is None, the probes ``window_cut`` (window ``probe_window``) and ``reset``
    (recurrent state emptied before the question). Distances are drawn per bucket whatever
    ``cfg``'s near/far settings; every answer is counted in the bucket of its own reach."""
    cfg = dataclasses.replace(cfg, far_share=None, distance_law="uniform", max_distance=None)
    runs = {"full": (window, False)}
    if probe_window is not None:
        runs.update(window_cut=(probe_window, False), reset=(window, True))
    out = []
    for b in buckets:
        row = {"bucket": b.label, "key": b.key, "lo": b.lo, "hi": b.hi, "length": b.length}
        row["inside_long"] = b.inside_long
        for name, (w, reset) in runs.items():
            try:
                res = episode_accuracy(
                    model,
                    tokenizer,
                    haystack,
                    [b.length],
                    samples,
                    cfg,
                    window=w,
                    seed=seed + b.hi,
                    progress=progress,
                    batch_size=batch_size,
                    reset_recurrent=reset,
                    reach_range=(max(b.lo + 1, 1), b.hi),
                    keep_answers=True,
                )[b.length]
            except SwaxError as e:  # below the episodes' min_distance: an empty bucket
                if not str(e).startswith("no distance"):
                    raise
                res = {"answers": []}
            tally = _tally(res["answers"], b.lo, b.hi)
            if name == "full":
                row.update(tally)
            else:
                row.setdefault("probes", {})[name] = tally
        out.append(row)
    return out


def check_buckets(
    tokenizer, haystack, cfg: SyntheticConfig, buckets: list[Bucket], model_vocab: int | None = None
) -> None:
    """Build one episode per bucket as :func:`recall_by_bucket` would, without a model, so that
    a configuration whose episodes cannot be made fails before any training: the SwaxError of
    the first bucket that cannot (an empty bucket, below min_distance, is allowed there too)."""
    import numpy as np

    from swax.data.mqar import resolve_mqar_ids
    from swax.data.synthetic import make_episode

    cfg = dataclasses.replace(cfg, far_share=None, distance_law="uniform", max_distance=None)
    vocab = getattr(tokenizer, "vocab_size", None)
    if vocab is not None:
        cfg = resolve_mqar_ids(cfg, vocab, model_vocab)
    hay = np.asarray(haystack)
    for b in buckets:
        try:
            make_episode(
                np.random.default_rng([0, b.length]),
                tokenizer,
                hay,
                b.length,
                cfg,
                reach_range=(max(b.lo + 1, 1), b.hi),
            )
        except SwaxError as e:
            if not str(e).startswith("no distance"):
                raise


def _pooled(rows: list[dict], inside: bool, upto: int | None = None) -> tuple[int, int]:
    sel = [r for r in rows if r["inside_long"] == inside and (upto is None or r["hi"] <= upto)]
    return sum(r["correct"] for r in sel), sum(r["n"] for r in sel)


def verdict(rows: list[dict], chance: float, seq_len: int) -> dict:
    """Recall inside W_long (pooled), in (W_long, T] and beyond T, and the run's class:
    ``lazy`` (>= 90 % inside, <= chance + 10 beyond W_long within T), ``memory`` (>= 50 %
    beyond W_long within T: the recurrent memory answers there), ``none`` (< 50 % inside:
    no retrieval learned), else ``partial``. Percentages; NaN where a bucket is empty."""
    k_in, n_in = _pooled(rows, True)
    k_mid, n_mid = _pooled(rows, False, seq_len)
    far = [r for r in rows if r["lo"] >= seq_len]
    k_far, n_far = sum(r["correct"] for r in far), sum(r["n"] for r in far)
    inside = 100 * k_in / n_in if n_in else math.nan
    beyond = 100 * k_mid / n_mid if n_mid else math.nan
    if not inside >= LEARNED:
        kind = "none"
    elif inside >= LAZY_INSIDE and beyond <= chance + LAZY_MARGIN:
        kind = "lazy"
    elif beyond >= LEARNED:
        kind = "memory"
    else:
        kind = "partial"
    return {
        "inside_long": inside,
        "beyond_long": beyond,
        "beyond_T": 100 * k_far / n_far if n_far else math.nan,
        "chance": chance,
        "kind": kind,
    }


def chance_of(cfg: SyntheticConfig) -> float:
    """Recall (%) of a uniform guess among the values."""
    return 100.0 / (cfg.mqar_values if cfg.task == "mqar" else 10**cfg.digits)


def bucket_table(rows: list[dict]) -> str:
    """Buckets × (recall, n, interval, probes) as aligned text."""
    probes = sorted({p for r in rows for p in r.get("probes", {})})
    head = ["bucket", "reach", "n", "recall %", "95% CI"] + [f"{p} %" for p in probes]

    def pct(x):
        return "–" if x != x else f"{x:.1f}"

    body = [
        [
            r["bucket"],
            f"{r['lo'] + 1}–{r['hi']}",
            str(r["n"]),
            pct(r["acc"]),
            f"{pct(r['ci'][0])}–{pct(r['ci'][1])}",
        ]
        + [pct(r["probes"][p]["acc"]) for p in probes]
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(x, widths)) for x in [head, *body])
