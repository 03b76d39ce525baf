"""When the memory emerged, as a censored time, and what the pairs of short and long windows
say about a delay.

One definition for every run: the memory has emerged at the first checkpoint where recall in
(W_long, T] (answers at uniform distances beyond the long window, the emergence probe) is at
least 50 % on at least 64 episodes, **and the next checkpoint holds it** (a first crossing that
fades is not an emergence). A run's curve qualifies when its checkpoints are at most 1M tokens
apart. The time is censored, and kept so:

- **left**: already at the first checkpoint: somewhere in (0, t_1];
- **interval**: between the checkpoint before and the one where it crossed: (t_{i-1}, t_i];
- **right**: not within the run (or crossed only at its last checkpoint, which no later one can
  confirm): after the budget; such a run is lazy at that budget, not a measured delay.

A pair (short and long window, same seed) has a known order only when the two intervals do not
overlap: the sign test counts those pairs alone. A factor long / short is given only where both
runs emerged and the order is known, as the range the two intervals allow.
"""

from __future__ import annotations

import math

from experiments.lab import stats as S

LEVEL = 50.0
MIN_EPISODES = 64
MAX_SPACING = 1.0e6
"""Tokens between checkpoints, at most."""


def unreadable(r: dict) -> str:
    """Why run ``r`` (laziness.record) cannot be read with the definition; "" when it can."""
    pts = sorted(r.get("emergence") or [], key=lambda p: p["tokens"])
    if not pts:
        curve = r.get("curve") or []
        toks = sorted(p["tokens"] for p in curve)
        gap = max((b - a for a, b in zip(toks, toks[1:])), default=math.nan)
        return "no recall beyond W_long per checkpoint" + (
            f" (only a learning curve: recall at 1× T over all distances, points "
            f"{gap / 1e6:.2f}M tokens apart)"
            if curve
            else ""
        )
    small = min(p.get("n", 0) for p in pts)
    if small < MIN_EPISODES:
        return f"{small} episodes per checkpoint (fewer than {MIN_EPISODES})"
    toks = [0] + [p["tokens"] for p in pts]
    gap = max(b - a for a, b in zip(toks, toks[1:]))
    if gap > MAX_SPACING * 1.0001:
        return f"checkpoints up to {gap / 1e6:.2f}M tokens apart (more than 1M)"
    return ""


def censored(r: dict) -> dict:
    """The emergence time of run ``r`` in millions of tokens: {"lo", "hi" (inf: not within
    the run), "kind" ("left", "interval" or "right"), "note"}."""
    pts = sorted(r["emergence"], key=lambda p: p["tokens"])
    ok = [p["acc"] >= LEVEL for p in pts]
    for i in range(len(pts) - 1):
        if ok[i] and ok[i + 1]:
            lo = pts[i - 1]["tokens"] / 1e6 if i else 0.0
            return {
                "lo": lo,
                "hi": pts[i]["tokens"] / 1e6,
                "kind": "interval" if i else "left",
                "note": "",
            }
    note = "crossed only at its last checkpoint" if ok and ok[-1] else ""
    return {"lo": pts[-1]["tokens"] / 1e6, "hi": math.inf, "kind": "right", "note": note}


def order(short: dict, long: dict) -> str:
    """ "long later", "short later" or "hidden" (the censoring intervals overlap)."""
    if long["lo"] >= short["hi"]:
        return "long later"
    if short["lo"] >= long["hi"]:
        return "short later"
    return "hidden"


def factor(short: dict, long: dict) -> tuple[float, float] | None:
    """The range of long / short the two intervals allow, where both emerged and the order is
    known; None otherwise."""
    if "right" in (short["kind"], long["kind"]) or order(short, long) == "hidden":
        return None
    lo = long["lo"] / short["hi"]
    hi = long["hi"] / short["lo"] if short["lo"] > 0 else math.inf
    return lo, hi


def cell(e: dict | None) -> str:
    if e is None:
        return "–"
    if e["kind"] == "left":
        return f"≤ {e['hi']:.2f}"
    if e["kind"] == "right":
        return f"> {e['lo']:.2f} (never)" + (f"; {e['note']}" if e["note"] else "")
    return f"{e['lo']:.2f}–{e['hi']:.2f}"


def factor_text(f: tuple[float, float] | None) -> str:
    if f is None:
        return "–"
    lo, hi = f
    return f"≥ {lo:.2f}" if hi == math.inf else f"{lo:.2f}–{hi:.2f}"


def pairs(short: list[dict], long: list[dict], stoch: list[dict]) -> dict:
    """The paired reading of one family: per seed the three censored times, the order and the
    factor; the sign test on the pairs whose order is known; the runs that never emerged."""
    by = {
        role: {r["seed"]: censored(r) for r in recs}
        for role, recs in (("short", short), ("long", long), ("stochastic", stoch))
    }
    seeds = sorted(set(by["short"]) & set(by["long"]))
    rows = []
    for seed in seeds:
        s, lg = by["short"][seed], by["long"][seed]
        rows.append(
            {
                "seed": seed,
                "short": s,
                "long": lg,
                "stochastic": by["stochastic"].get(seed),
                "order": order(s, lg),
                "factor": factor(s, lg),
            }
        )
    later = sum(r["order"] == "long later" for r in rows)
    earlier = sum(r["order"] == "short later" for r in rows)
    one, two = S.sign_test_p(later, earlier)
    return {
        "rows": rows,
        "later": later,
        "earlier": earlier,
        "hidden": len(rows) - later - earlier,
        "p_one": one,
        "p_two": two,
        "never": {role: sum(e["kind"] == "right" for e in by[role].values()) for role in by},
        "runs": {role: len(by[role]) for role in by},
        "both": [r for r in rows if r["factor"] is not None],
        "spacing": spacing([*short, *long, *stoch]),
    }


def spacing(recs: list[dict]) -> float:
    """The widest gap between checkpoints (millions of tokens), the first one counted from 0."""
    gaps = []
    for r in recs:
        toks = [0] + sorted(p["tokens"] for p in r["emergence"])
        gaps += [(b - a) / 1e6 for a, b in zip(toks, toks[1:])]
    return max(gaps, default=math.nan)


def summary(d: dict, budget: float) -> str:
    """One sentence: the sign test, the delays where both emerged, the runs never emerged."""
    n = len(d["rows"])
    both = d["both"]
    delays = (
        "; where both emerged and the order is known, long / short "
        + ", ".join(f"{factor_text(r['factor'])} (seed {r['seed']})" for r in both)
        if both
        else "; no pair in which both emerged has a known order, so no delay factor"
    )
    never = d["never"]
    return (
        f"Of {n} pairs the long window emerged later in {d['later']}, earlier in "
        f"{d['earlier']}, and censoring hides the order in {d['hidden']}: exact sign test on "
        f"the {d['later'] + d['earlier']} known, one-sided p = {_p(d['p_one'])} (long later), "
        f"two-sided p = {_p(d['p_two'])}{delays}. Never emerged within {budget:.1f}M tokens "
        f"(lazy at that budget, not a measured delay): long {never['long']} of "
        f"{d['runs']['long']}, short {never['short']} of {d['runs']['short']}"
        + (
            f", stochastic {never['stochastic']} of {d['runs']['stochastic']}"
            if d["runs"]["stochastic"]
            else ""
        )
        + "."
    )


def _p(p: float) -> str:
    return "–" if p != p else f"{p:.3f}"
