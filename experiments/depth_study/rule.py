"""RULE.md applied: the depth study's readings and verdicts from archived per-run results.

Every function takes the committed per-run dicts (``results/*/NAME/seedS.json``: the sweep's
``eval.json`` with ``copies``, ``passkey`` and ``text_val_loss``) and returns plain data; the
report prints it. Section numbers refer to RULE.md.
"""

from __future__ import annotations

import math
from fractions import Fraction

from experiments.lab.stats import paired
from swax.probes.passkey import wilson

DELTA = 0.01
"""Minimum copy gain that counts (nats per event), section 4."""
POINTS = 0.05
"""Minimum retrieval difference that counts (share), section 4."""
MEMORY = "beyond_256"
"""Claim 2's range, (256, T]: beyond any attention path of two layers at W = 128."""
BEYOND_T = "r1024_4096"
INSIDE = "r32_128"
"""Inside W_long, beyond W_short: where the mechanism is read."""
FAR_DISTANCES = (2048, 4096, 8192, 16384)
"""The passkey distances of claim 1: 2T to 16T."""
NEAR_DISTANCES = (32, 64, 128)
"""The attention control's passkey distances: inside W = 128."""


# ------------------------------------------------------------------------------ reading a run


def row(rec: dict | None, key: str) -> dict | None:
    """The copy-probe row of range ``key`` of a run, None when absent."""
    if not rec:
        return None
    for r in rec.get("copies", {}).get("buckets", []):
        if r["key"] == key:
            return r
    return None


def excess(rec, key) -> dict | None:
    """E: the copy gain above the placebo (section 2)."""
    r = row(rec, key)
    return r.get("excess") if r else None


def gain(rec, key, probe: str | None = None) -> dict | None:
    """G with the run's own window, or a probe's (window_cut, reset)."""
    r = row(rec, key)
    if not r:
        return None
    return r.get("probes", {}).get(probe) if probe else r.get("gain")


def counts(g: dict | None) -> bool:
    """A copy gain that counts: lower bound above 0 and mean at least DELTA (section 4)."""
    return bool(g and g.get("n") and g["ci"][0] > 0 and g["mean"] >= DELTA)


def mean(g: dict | None) -> float:
    return g["mean"] if g and g.get("n") else math.nan


def pooled(rec: dict | None, distances, control: bool = False) -> dict:
    """Passkey retrieval pooled over ``distances``: {k, n, share, ci (Wilson)}."""
    k = n = 0
    pre = "control_" if control else ""
    for r in (rec or {}).get("passkey", {}).get("rows", []):
        if r["distance"] in distances:
            k += round(r[f"{pre}retrieved"] * r["n"])
            n += r["n"]
    share = k / n if n else math.nan
    return {"k": k, "n": n, "share": share, "ci": wilson(k, n)}


def points_above(a: dict, b: dict, points: float = POINTS) -> bool:
    """Share a ≥ share b + ``points``, decided on the counts (k/n) so that an exact tie (40
    more of 800) is not lost to float rounding."""
    gap = Fraction(a["k"], a["n"]) - Fraction(b["k"], b["n"])
    return gap >= Fraction(points).limit_denominator(1000)


def pooled_gain(rec: dict | None, distances) -> dict:
    """The passkey gain (nats per key token) averaged over ``distances``, with a 95 % interval
    from the distances' bootstrap intervals (normal approximation: each interval's half-width /
    1.96 as its standard error, the trials of different distances independent)."""
    rows = [r for r in (rec or {}).get("passkey", {}).get("rows", []) if r["distance"] in distances]
    gains = [r["gain"] for r in rows if r.get("gain", {}).get("n")]
    if not gains:
        return {"mean": math.nan, "ci": [math.nan, math.nan], "n": 0}
    m = sum(x["mean"] for x in gains) / len(gains)
    se = math.sqrt(sum(((x["ci"][1] - x["ci"][0]) / 3.92) ** 2 for x in gains)) / len(gains)
    return {"mean": m, "ci": [m - 1.96 * se, m + 1.96 * se], "n": sum(x["n"] for x in gains)}


# ------------------------------------------------------------------------------ the controls


def memory_control(rec: dict | None) -> dict:
    """Section 3: E over (128, T] counts and the reset takes G there to about 0."""
    if not rec:
        return {"passes": False, "why": "no result"}
    e, g, z = excess(rec, "beyond_128"), gain(rec, "beyond_128"), gain(rec, "beyond_128", "reset")
    if not counts(e):
        return {"passes": False, "why": f"E over (128, T] does not count ({fmt(e)})"}
    if z is None or not (z["ci"][0] <= 0 <= z["ci"][1] or z["mean"] < 0.25 * g["mean"]):
        return {"passes": False, "why": f"the reset leaves {fmt(z)} of G {fmt(g)}"}
    return {"passes": True, "why": f"E {fmt(e)}, reset {fmt(z)}"}


def attention_control(rec: dict | None) -> dict:
    """Section 3: E over (32, 128] counts and the passkey comes back at d <= 128."""
    if not rec:
        return {"passes": False, "why": "no result"}
    e, p = excess(rec, INSIDE), pooled(rec, NEAR_DISTANCES)
    if not counts(e):
        return {"passes": False, "why": f"E over (32, 128] does not count ({fmt(e)})"}
    if not p["n"] or p["ci"][0] <= POINTS:
        return {"passes": False, "why": f"passkey at d <= 128: {share(p)}"}
    return {"passes": True, "why": f"E {fmt(e)}, passkey at d <= 128 {share(p)}"}


# ------------------------------------------------------------------------------ per seed


def claim1_seed(short: dict, long: dict | None) -> dict:
    """Section 5, one seed: has a memory, copies beyond T, retrieves beyond T; holds / fails."""
    mem = counts(excess(short, MEMORY))
    e_far = excess(short, BEYOND_T)
    ps, pl = pooled(short, FAR_DISTANCES), pooled(long, FAR_DISTANCES)
    pc = pooled(short, FAR_DISTANCES, control=True)
    retr = bool(ps["n"] and pl["n"]) and (
        ps["ci"][0] > pl["ci"][1] and points_above(ps, pl) and ps["ci"][0] > pc["ci"][1]
    )
    gs, gl = pooled_gain(short, FAR_DISTANCES), pooled_gain(long, FAR_DISTANCES)
    by_gain = counts(gs) and bool(gl.get("n")) and gs["ci"][0] > gl["ci"][1]
    retr = retr or by_gain
    copies = counts(e_far)
    fails = (
        mem
        and e_far is not None
        and e_far["ci"][1] < DELTA
        and ps["ci"][1] < POINTS
        and bool(gs["n"])
        and gs["ci"][1] < DELTA
    )
    return {
        "memory": mem,
        "copies_beyond_T": copies,
        "retrieves": retr,
        "holds": mem and copies and retr,
        "fails": bool(fails),
        "passkey": ps,
        "passkey_long": pl,
        "E_far": e_far,
        "key_gain": gs,
        "key_gain_long": gl,
    }


def claim2_seed(short: dict, long: dict) -> dict:
    """Section 6, one pair: the primary (interval) and secondary (point) readings."""
    es, el = excess(short, MEMORY), excess(long, MEMORY)
    ref = counts(es)
    out = {
        "reference": ref,
        "E_short": es,
        "E_long": el,
        "primary": "no reference",
        "secondary": "no reference",
    }
    if not ref:
        return out
    if el is None or not el.get("n"):
        out["primary"] = out["secondary"] = "no long result"
        return out
    separated = el["ci"][1] < es["ci"][0] and es["mean"] - el["mean"] >= DELTA
    if separated and el["mean"] < 0.75 * es["mean"]:
        out["primary"] = "lazy"
    elif counts(el) and el["mean"] >= 0.75 * es["mean"]:
        out["primary"] = "not lazy"
    else:
        out["primary"] = "unclear"
    ratio = el["mean"] / es["mean"]
    out["secondary"] = "lazy" if ratio <= 0.25 else "not lazy" if ratio >= 0.75 else "unclear"
    return out


def mechanism_seed(short: dict, long: dict) -> dict:
    """Section 6: attention copies inside W_long and the long run's memory idles there."""
    g_l, r_l, c_l = (
        gain(long, INSIDE),
        gain(long, INSIDE, "reset"),
        gain(long, INSIDE, "window_cut"),
    )
    g_s = gain(short, INSIDE)
    a = counts(r_l) and g_l is not None and r_l["mean"] >= 0.5 * g_l["mean"]
    b = c_l is not None and g_s is not None and c_l["ci"][1] < g_s["ci"][0]
    return {
        "attention_copies": bool(a),
        "memory_idles": bool(b),
        "seen": bool(a and b),
        "reset": r_l,
        "cut": c_l,
        "gain": g_l,
        "short": g_s,
    }


def claim3_seed(short: dict, stoch: dict) -> dict:
    """Section 7, memory half, one seed."""
    es, et = excess(short, MEMORY), excess(stoch, MEMORY)
    if not counts(es) or et is None or not et.get("n"):
        return {"reading": "no reference", "E_stoch": et}
    if counts(et) and et["mean"] >= 0.75 * es["mean"]:
        return {"reading": "keeps", "E_stoch": et}
    if et["ci"][1] < 0.25 * es["mean"]:
        return {"reading": "loses", "E_stoch": et}
    return {"reading": "unclear", "E_stoch": et}


# ------------------------------------------------------------------------------ verdicts


def need(planned: int) -> int:
    """Seeds a verdict needs: 4 of 5, 3 of 3 (sections 5-7)."""
    return 4 if planned >= 5 else planned


def sign_p(k: int, n: int) -> float:
    """One-sided exact sign test: P(at least k of n | as likely as not)."""
    return sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n if n else math.nan


def claim1_verdict(seeds: list[dict], planned: int, control_ok: bool) -> str:
    if not control_ok:
        return "cannot decide at this scale (the memory control failed)"
    if len(seeds) < planned:
        return f"incomplete, {len(seeds)} of {planned} seeds"
    k = need(planned)
    if sum(s["memory"] for s in seeds) < k:
        return "cannot decide at this scale (too few short runs have a memory)"
    if sum(s["holds"] for s in seeds) >= k:
        return "held"
    if sum(s["fails"] for s in seeds) >= k:
        return "did not hold"
    return "partial"


def claim2_verdict(seeds: list[dict], planned: int, controls_ok: bool) -> str:
    if not controls_ok:
        return "cannot decide at this scale (a control failed)"
    if len(seeds) < planned:
        return f"incomplete, {len(seeds)} of {planned} seeds"
    k = need(planned)
    if sum(s["reference"] for s in seeds) < k:
        return "cannot decide at this scale (too few pairs have a reference)"
    lazy = sum(s["primary"] == "lazy" for s in seeds)
    not_lazy = sum(s["primary"] == "not lazy" for s in seeds)
    if lazy >= k and not_lazy == 0:
        return "held"
    if not_lazy >= k:
        return "did not hold"
    return "partial"


def memory_half(seeds: list[dict], planned: int, control_ok: bool = True) -> str:
    if not control_ok:
        return "cannot decide at this scale (the memory control failed)"
    if len(seeds) < planned:
        return f"incomplete, {len(seeds)} of {planned} seeds"
    k = need(planned)
    keeps = sum(s["reading"] == "keeps" for s in seeds)
    loses = sum(s["reading"] == "loses" for s in seeds)
    if keeps >= k:
        return "held"
    if loses >= k:
        return "did not hold"
    return "cannot be shown at this scale"


def quality_half(
    short: list[float],
    long: list[float],
    stoch: list[float],
    planned: int = 2,
    control_ok: bool = True,
) -> dict:
    """Section 7: the paired t intervals of stoch − long and of c = short − long (a verdict once
    all ``planned`` seeds are in, and only when the family's memory control passed)."""
    if not control_ok:
        return {"verdict": "cannot decide at this scale (the memory control failed)", "c": None}
    if len(stoch) < max(planned, 2):
        return {"verdict": f"incomplete, {len(stoch)} of {planned} seeds", "c": None}
    c = paired(short, long)
    d = paired(stoch, long)
    lo_c, hi_c = c["ci"]
    half = c["mean"] / 2
    if c["mean"] < 0 or lo_c <= 0 <= hi_c:
        verdict = "not applicable (no trade-off: the short window's loss is not higher)"
    elif d["ci"][1] < half:
        verdict = "held"
    elif d["ci"][0] > half:
        verdict = "did not hold"
    else:
        verdict = "cannot be shown at this scale"
    return {"verdict": verdict, "c": c, "d": d}


def tally(f: dict) -> tuple[int, int, int, int]:
    """A family's paired seeds and, among them, how many hold claim 1, read lazy (primary) and
    show the mechanism."""
    return (
        len(f["seeds"]),
        sum(x["holds"] for x in f["c1"]),
        sum(x["primary"] == "lazy" for x in f["c2"]),
        sum(x["seen"] for x in f["mech"]),
    )


# ------------------------------------------------------------------------------ read, not judged

REFERENCE_RANGES = ("r8_32", "r32_128", "r128_512")
"""Section 8: where the T = 4096 reference must match the T = 1024 short run."""


def overlaps(a: dict | None, b: dict | None) -> bool:
    return bool(a and b and a.get("n") and b.get("n")) and (
        a["ci"][0] <= b["ci"][1] and b["ci"][0] <= a["ci"][1]
    )


def reference_reading(ref: dict, short: dict | None) -> dict:
    """Section 8: the reference counts when its G overlaps the short run's in each of
    REFERENCE_RANGES; then E over (T, 4T] of both, side by side."""
    ok = all(overlaps(gain(ref, k), gain(short, k)) for k in REFERENCE_RANGES)
    return {
        "counts": ok,
        "E_far_short": excess(short, BEYOND_T),
        "E_far_ref": excess(ref, BEYOND_T),
    }


def loss_gap(a: dict | None, b: dict | None) -> float | None:
    """Held-out text loss of run ``a`` minus run ``b``'s, each at its own window (the paired
    difference claim 3's quality half and section 8 read); None when either has none."""
    if not a or not b or "text_val_loss" not in a or "text_val_loss" not in b:
        return None
    return a["text_val_loss"] - b["text_val_loss"]


def lr_reading(short: dict | None, long: dict | None) -> dict:
    """Section 8: one learning rate's claim-2 reading and text-loss gap loss(short) − loss(long)."""
    c2 = claim2_seed(short or {}, long or {})
    gap = loss_gap(short, long)
    return {
        "primary": c2["primary"],
        "secondary": c2["secondary"],
        "gap": math.nan if gap is None else gap,
    }


def hinges(readings: list[dict]) -> bool:
    """Section 8: the primary claim-2 reading or the sign of the gap differs between lrs."""
    prim = {r["primary"] for r in readings}
    signs = {r["gap"] > 0 for r in readings if not math.isnan(r["gap"])}
    return len(prim) > 1 or len(signs) > 1


def lasting_from(rec: dict | None, key: str = MEMORY) -> int | None:
    """Section 6 (partial): the first checkpoint from which G over ``key`` keeps its lower bound
    above 0 at every later checkpoint (None: never, or no curve)."""
    pts = sorted((rec or {}).get("copy_curve", []), key=lambda p: p["step"])
    first = None
    for p in pts:
        lo = p.get("ci", {}).get(key, [math.nan])[0]
        if lo > 0:
            first = p["step"] if first is None else first
        else:
            first = None
    return first


# ------------------------------------------------------------------------------ text


def fmt(g: dict | None) -> str:
    if not g or not g.get("n"):
        return "–"
    lo, hi = g["ci"]
    return f"{g['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def efmt(e: dict | None) -> str:
    """An E with its count (section 2: events where no placebo span fits are left out)."""
    return fmt(e) + (f" n {e['n']}" if e and e.get("n") else "")


def share(p: dict) -> str:
    if not p.get("n"):
        return "–"
    lo, hi = p["ci"]
    return f"{100 * p['share']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}] of {p['n']}"
