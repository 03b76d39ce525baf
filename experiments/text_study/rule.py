"""The text-only study's rule (TEXT_RULE.md, committed before the first main run), as functions:
the reading of a control, of a seed, of a family, of claim 3's two halves and of the map's
prediction. readings.py applies them to the archived runs; report.py writes the reports.
"""

from __future__ import annotations

from experiments.lab import stats as S

LAZY, NOT_LAZY = 0.25, 0.75
"""A long window is lazy in a seed at <= LAZY x the short window's memory gain beyond W_long,
not lazy at >= NOT_LAZY x (TEXT_RULE.md section 4)."""
RANGES = ("r8_32", "r32_64", "r64_128", "r128_256", "r256_1024", "beyond_32", "beyond_64")
# The laziness map's prediction, as TEXT_RULE.md section 6 committed it before the main runs:
# rho*(W = T/4) of the map with episode ids 128-175, its bootstrap interval, and the answers'
# share of that study's targets (the per-target scale of regime_study/REPORT.md section 4).
RHO_STAR = (0.0025, 0.0, 0.0125)
ANSWERS_OF_TARGETS = 0.034


# ------------------------------------------------------------------------------ reading a run


def gain(rec: dict | None, key: str, probe: str | None = None) -> dict | None:
    """The copy gain row ``key`` of a run's result (``probe``: window_cut or reset), or None."""
    if not rec:
        return None
    for row in rec.get("copies", {}).get("buckets", []):
        if row["key"] == key:
            g = row.get("probes", {}).get(probe) if probe else row.get("gain")
            return g if g and g.get("n") else None
    return None


def fmt(g: dict | None, digits: int = 3) -> str:
    """'mean [lo, hi]' with a star where the range copies (lower bound above 0)."""
    if not g:
        return "–"
    lo, hi = g["ci"]
    star = "*" if g.get("copies") else ""
    return f"{g['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]{star}"


def far_key(w_long: int) -> str:
    """The range read as G beyond W_long (TEXT_RULE.md section 1)."""
    return {64: "beyond_64", 128: "r128_256"}[w_long]


# ------------------------------------------------------------------------------ the rule


def control_reading(rec: dict) -> dict:
    """TEXT_RULE.md section 2: the control passes when its gain over (32, T] copies and its
    reset probe there is about 0; it earns the W_long = 128 arm when it also copies in
    (128, 256]."""
    g, r = gain(rec, "beyond_32"), gain(rec, "beyond_32", "reset")
    copies = bool(g and g["copies"])
    reset_zero = bool(r and g and (r["ci"][0] <= 0 <= r["ci"][1] or r["mean"] < 0.25 * g["mean"]))
    passes = copies and reset_zero
    if not g:
        why = "no copy events read"
    elif not copies:
        why = f"gain beyond 32 {fmt(g)}: its interval does not lie above 0"
    elif not reset_zero:
        why = f"the reset keeps {fmt(r)} of the gain {fmt(g)}: not the memory alone"
    else:
        why = f"gain beyond 32 {fmt(g)}, reset {fmt(r)}"
    far = gain(rec, "r128_256")
    return {"passes": passes, "why": why, "arm128": passes and bool(far and far["copies"])}


def seed_reading(g_short: dict | None, g_other: dict | None) -> str:
    """TEXT_RULE.md section 4, one seed: 'no reference' (the short window's memory does not copy
    beyond W_long), 'lazy' (the other run gains <= 0.25x the short one's), 'not lazy' (>=
    0.75x) or 'between'."""
    if not g_short or not g_short["copies"] or g_other is None:
        return "no reference"
    ratio = g_other["mean"] / g_short["mean"]
    if ratio <= LAZY:
        return "lazy"
    if ratio >= NOT_LAZY:
        return "not lazy"
    return "between"


def _needs(planned: int) -> tuple[int, int]:
    """(pairs with a reference needed, not-lazy seeds needed) for ``planned`` seeds: 4 of 5 on
    pystdlib, all of 3 on KJV."""
    return (planned - 1, planned - 1) if planned >= 5 else (planned, planned)


def family_verdict(readings: list[str], planned: int) -> str:
    """TEXT_RULE.md section 4: one verdict from the per-seed readings."""
    if len(readings) < planned:
        return f"incomplete ({len(readings)} of {planned} seeds)"
    refs = sum(r != "no reference" for r in readings)
    need_ref, need_not = _needs(planned)
    if refs < need_ref:
        return "cannot decide at this scale"
    if sum(r == "lazy" for r in readings) == planned:
        return "lazy"
    if sum(r == "not lazy" for r in readings) >= need_not:
        return "not lazy"
    return "partial"


def memory_half(readings: list[str], planned: int) -> str:
    """TEXT_RULE.md section 5: claim 3's memory half from the stochastic runs' readings."""
    if len(readings) < planned:
        return f"incomplete ({len(readings)} of {planned} seeds)"
    need_ref, need_not = _needs(planned)
    if sum(r != "no reference" for r in readings) < need_ref:
        return "cannot be shown at this scale"
    if sum(r == "not lazy" for r in readings) >= need_not:
        return "held"
    if sum(r == "lazy" for r in readings) == planned:
        return "did not hold"
    return "cannot be shown at this scale"


def quality_half(short: list[float], long: list[float], stoch: list[float]) -> dict:
    """TEXT_RULE.md section 5: the paired t interval of loss(stoch) - loss(long) against half
    the short window's cost c = loss(short) - loss(long)."""
    cost = S.paired(short, long)
    diff = S.paired(stoch, long)
    out = {"cost": cost, "diff": diff}
    if cost["n"] < 2 or diff["n"] < 2:
        return {**out, "verdict": "cannot be shown at this scale"}
    half = cost["mean"] / 2
    if cost["ci"][0] <= 0 <= cost["ci"][1]:
        verdict = "not applicable"
    elif diff["ci"][1] < half:
        verdict = "held"
    elif diff["ci"][0] > half:
        verdict = "did not hold"
    else:
        verdict = "cannot be shown at this scale"
    return {**out, "verdict": verdict}


def appeared_at(points: list[dict], key: str) -> float | None:
    """Millions of tokens at the first checkpoint where the gain in ``key`` has its interval
    above 0 there and at the next checkpoint (TEXT_RULE.md section 4's curves); None if never."""
    pts = sorted(points, key=lambda p: p["tokens"])
    above = [bool(p.get("ci", {}).get(key) and p["ci"][key][0] > 0) for p in pts]
    for i in range(len(pts) - 1):
        if above[i] and above[i + 1]:
            return pts[i]["tokens"] / 1e6
    return None


def predict(share: float, rho: tuple[float, float, float], per: float) -> str:
    """What a laziness map predicts (TEXT_RULE.md section 6) for a corpus whose natural far share
    is ``share`` of its targets. ``rho``: the map's rho* at the row's window and its 95 %
    interval (value, lo, hi), shares of the map's *episodes*; ``per``: the answers' share of the
    map's targets, which puts rho* on the corpus's scale (the primary reading; ``per = 1`` reads
    the text's share as the episodes' share, the secondary one). Above the interval: *not lazy*;
    below it: *lazy*; inside it: *cannot predict*."""
    _, lo, hi = rho
    if share > hi * per:
        return "not lazy"
    if share < lo * per:
        return "lazy"
    return "cannot predict"


def map_prediction(verdict: str, predicted: str = "not lazy") -> str:
    """The verdict read against the map's prediction (TEXT_RULE.md section 6, whose committed map
    predicts *not lazy* on both corpora in the primary reading)."""
    if predicted == "cannot predict":
        return (
            "neither confirmed nor refuted (the map cannot predict: the far share lies inside "
            "ρ*'s interval)"
        )
    if verdict == predicted:
        return f"confirmed (predicted {predicted})"
    if verdict in ("lazy", "not lazy"):
        return f"refuted (predicted {predicted})"
    return f"neither confirmed nor refuted (predicted {predicted}; the verdict is {verdict})"
