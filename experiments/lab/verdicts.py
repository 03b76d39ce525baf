"""The one verdict rule of the regime study's claims: a part of a claim is decided by the 95 %
interval of its quantity against its threshold.

- **held** when the interval lies wholly on the claim's side of the threshold;
- **did not hold** when it lies wholly on the other side;
- **cannot be shown at this scale** when it contains the threshold (touching counts as
  containing), with how many seeds would settle it at the observed value and spread.

Two kinds of quantity:

- a **seed share** (how many seeds did something, against one half: "most seeds"): its exact
  (Clopper-Pearson) interval. No share of 4 seeds settles one half (4 of 4 is 40-100 %).
- a **paired difference** over seeds, against a threshold: the 95 % Student t interval of the
  mean, with the exact two-sided sign-flip p of the differences minus the threshold printed
  beside it, and the smallest true difference the design detects at 80 % power (the exact
  noncentral t value). When every difference is the same the t interval has no width and says
  nothing: the exact sign-flip test decides then (it needs 6 seeds to reach p < 0.05).

Plain Python (stats.py); verdicts as strings so that reports and tests read them alike.
"""

from __future__ import annotations

import math

from experiments.lab import stats as S

HELD, NOT, CANNOT = "held", "did not hold", "cannot be shown at this scale"
MOST_SEEDS = 6
"""No exact test on fewer seeds reaches 5 % two-sided: 2 / 2**5 = 0.0625, 2 / 2**6 = 0.031."""
SETTLE_CAP = 100_000
"""Seed counts beyond this are reported as 'more than'."""


def decide(lo: float, hi: float, threshold: float, above: bool = True) -> str:
    """The verdict of an interval [lo, hi] for a claim that the quantity lies above
    (``above``) or below ``threshold``."""
    if lo != lo or hi != hi:
        return CANNOT
    if lo > threshold:
        return HELD if above else NOT
    if hi < threshold:
        return NOT if above else HELD
    return CANNOT


def share(k: int, n: int, above: bool = True) -> dict:
    """A seed share k of n against one half: {"k", "n", "ci" (exact, %), "verdict",
    "settle" (seeds that would settle it at the share k / n; None: never, the share is one
    half; 0: settled already)}."""
    lo, hi = S.clopper_pearson(k, n) if n else (math.nan, math.nan)
    v = CANNOT if n == 0 else decide(lo, hi, 50.0, above)
    return {
        "k": k,
        "n": n,
        "ci": (lo, hi),
        "verdict": v,
        "above": above,
        "settle": 0 if v != CANNOT else settle_share(k, n),
    }


def settle_share(k: int, n: int) -> int | None:
    """The fewest seeds whose exact interval, at the observed share k / n (rounded toward one
    half), excludes one half; None when the share is one half (or there are no seeds)."""
    if n == 0 or 2 * k == n:
        return None
    p = k / n
    for m in range(n + 1, SETTLE_CAP):
        j = math.ceil(p * m - 1e-9) if p < 0.5 else math.floor(p * m + 1e-9)
        lo, hi = S.clopper_pearson(j, m)
        if hi < 50 or lo > 50:
            return m
    return SETTLE_CAP


def paired(d: list[float], threshold: float = 0.0, above: bool = True) -> dict:
    """The mean of the paired differences ``d`` against ``threshold``: {"n", "mean", "sd",
    "se", "ci" (95 % t), "p" (exact two-sided sign-flip p of d - threshold), "mde" (the
    smallest true difference the design detects: 95 % two-sided, 80 % power, noncentral t),
    "verdict", "settle" (seeds that would settle it at this mean and spread; None: never),
    "why" (a short reason when it cannot be shown), "threshold"}. NaN differences are left
    out."""
    d = [x for x in d if x == x]
    n = len(d)
    out = {
        "n": n,
        "d": d,
        "threshold": threshold,
        "above": above,
        "mean": math.nan,
        "sd": math.nan,
        "se": math.nan,
        "ci": (math.nan, math.nan),
        "p": math.nan,
        "mde": math.nan,
        "settle": None,
    }
    if n == 0:
        return {**out, "verdict": CANNOT, "why": "cannot be judged: no paired seeds"}
    m = sum(d) / n
    out.update(mean=m, p=S.sign_flip_p([x - threshold for x in d]))
    if n < 2:
        return {
            **out,
            "verdict": CANNOT,
            "why": "cannot be judged: one seed has no spread",
            "settle": MOST_SEEDS,
        }
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    t = S.t_quantile(0.975, n - 1)
    out.update(sd=sd, se=se, ci=(m - t * se, m + t * se), mde=S.mde_se(n) * se)
    if sd == 0:  # a t interval of no width: the exact test decides
        side = (m > threshold) == above
        if m != threshold and out["p"] < 0.05:
            return {**out, "verdict": HELD if side else NOT, "settle": 0, "why": ""}
        why = (
            f"has no width (every seed differs by the same {m:.4g}), so the exact sign-flip "
            f"test decides, and with {n} seeds its p cannot go below {2 / 2**n:.3g}"
        )
        return {
            **out,
            "verdict": CANNOT,
            "why": why,
            "settle": None if m == threshold else max(MOST_SEEDS, n + 1),
        }
    v = decide(*out["ci"], threshold, above)
    if v != CANNOT:
        return {**out, "verdict": v, "settle": 0, "why": ""}
    return {
        **out,
        "verdict": CANNOT,
        "why": "contains",
        "settle": settle_mean(m - threshold, sd, n),
    }


def settle_mean(gap: float, sd: float, n: int) -> int | None:
    """The fewest seeds (more than ``n``) whose 95 % t interval, at this mean distance from the
    threshold ``gap`` and spread ``sd``, excludes the threshold; None when gap is 0."""
    if gap == 0 or gap != gap:
        return None
    lo, hi = n + 1, SETTLE_CAP

    def settled(m: int) -> bool:
        return S.t_quantile(0.975, m - 1) * sd / math.sqrt(m) < abs(gap)

    if not settled(hi):
        return SETTLE_CAP
    while lo < hi:  # the half-width falls with m: the first m that settles it
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if settled(mid) else (mid + 1, hi)
    return lo


def fnum(x: float, digits: int) -> str:
    return "–" if x != x else f"{x:.{digits}f}"


def settle_text(res: dict) -> str:
    """'; 6 seeds would settle it at the observed …' for a verdict that cannot be shown."""
    if res["verdict"] != CANNOT:
        return ""
    s = res.get("settle")
    what = "share" if "k" in res else "mean and spread"
    if s is None:
        return f"; no number of seeds settles it at the observed {what}"
    more = "more than " if s >= SETTLE_CAP else ""
    return f"; {more}{s:,} seeds would settle it at the observed {what}"


def share_text(res: dict, what: str) -> str:
    """'{what}: 2 of 4 (95 % exact interval 7–93 %), which contains one half; no number of
    seeds …'."""
    lo, hi = res["ci"]
    where = "above" if lo > 50 else "below" if hi < 50 else ""
    side = f"lies {where} one half" if where else "contains one half"
    return (
        f"{what}: {res['k']} of {res['n']} (95 % exact interval {lo:.0f}–{hi:.0f} %), which "
        f"{side}" + settle_text(res)
    )


def paired_text(res: dict, what: str, digits: int = 1, against: str = "") -> str:
    """'{what}: mean m (95 % t interval lo to hi; exact sign-flip p = P, n seeds), which lies
    above / below / contains {against or the threshold}' with, when it cannot be shown, the
    smallest difference the design detects and the seeds that would settle it."""
    lo, hi = res["ci"]
    thr = against or f"{res['threshold']:g}"
    if res["verdict"] == CANNOT:
        rel = f"contains {thr}" if res["why"] == "contains" else res["why"]
    else:
        up = lo > res["threshold"]
        rel = f"lies {'above' if up else 'below'} {thr}"
    mde = (
        f"; the smallest difference this design detects (95 %, 80 % power) is "
        f"{fnum(res['mde'], digits)}"
        if res["verdict"] == CANNOT and res["mde"] == res["mde"] and res["sd"] > 0
        else ""
    )
    return (
        f"{what}: mean {fnum(res['mean'], digits)} (95 % t interval {fnum(lo, digits)} to "
        f"{fnum(hi, digits)}; exact sign-flip p = {fnum(res['p'], 3)}; {res['n']} seeds), which "
        f"{rel}{mde}" + settle_text(res)
    )


def combine(verdicts: list[str]) -> str:
    """A claim's verdict from its parts' (or a part's from its conditions' when every one must
    hold): held when all held, did not hold when one did not and none held, else cannot be
    shown or held in part."""
    if all(v == HELD for v in verdicts):
        return HELD
    if NOT in verdicts:
        return "held in part" if HELD in verdicts else NOT
    return "held in part" if HELD in verdicts else CANNOT


def all_of(verdicts: list[str]) -> str:
    """One part made of conditions that must all hold: held when all held, did not hold when
    any did not, else cannot be shown."""
    if NOT in verdicts:
        return NOT
    return HELD if all(v == HELD for v in verdicts) else CANNOT
