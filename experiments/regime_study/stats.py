"""The statistics the regime study's reports print: exact intervals for seed shares, paired
comparisons over seeds (mean, standard error, smallest detectable difference, an exact sign-flip
test), bootstrap intervals over seeds, and when a curve first crosses a level.

Plain Python (no scipy): the seed counts are small (3 or 4), so exact enumeration is cheap.
"""

from __future__ import annotations

import itertools
import math
import random

# Student t quantiles by degrees of freedom (two-sided 95 %: 0.975; one-sided 80 % power: 0.80)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}  # fmt: skip
T80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889,
       9: 0.883, 10: 0.879, 15: 0.866, 20: 0.860, 30: 0.854}  # fmt: skip


def _t(table: dict, df: int, z: float) -> float:
    if df < 1:
        return math.nan
    keys = sorted(table)
    for k in keys:  # the tabulated df at or below df (conservative between entries)
        if k >= df:
            return table[k] if k == df else table[max(x for x in keys if x <= df)]
    return z


def binom_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a binomial share k / n, in %."""
    if n == 0:
        return math.nan, math.nan
    a = (1 - level) / 2

    def solve(f, lo=0.0, hi=1.0):  # f increasing in p: the p where f(p) = 0, by bisection
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: (1 - binom_cdf(k - 1, n, p)) - a)
    upper = 1.0 if k == n else solve(lambda p: a - binom_cdf(k, n, p))
    return 100 * lower, 100 * upper


def share_text(k: int, n: int) -> str:
    """'k of n (95 % exact interval lo–hi %)'."""
    lo, hi = clopper_pearson(k, n)
    return f"{k} of {n} ({lo:.0f}–{hi:.0f} %)"


def paired(a: list[float], b: list[float]) -> dict:
    """a − b over pairs with both values finite: mean, standard error, 95 % t interval, the
    smallest difference the design detects (95 % two-sided, 80 % power: (t.975 + t.80) × SE),
    the exact two-sided sign-flip p-value, and n."""
    d = [x - y for x, y in zip(a, b) if x == x and y == y]
    n = len(d)
    if n == 0:
        return {"mean": math.nan, "se": math.nan, "ci": (math.nan, math.nan), "mde": math.nan,
                "p": math.nan, "n": 0}  # fmt: skip
    m = sum(d) / n
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n) if n > 1 else math.nan
    t = _t(T975, n - 1, 1.96)
    return {
        "mean": m,
        "se": se,
        "ci": (m - t * se, m + t * se),
        "mde": (t + _t(T80, n - 1, 0.84)) * se,
        "p": sign_flip_p(d),
        "n": n,
    }


def unpaired_mde(a: list[float], b: list[float]) -> float:
    """The smallest difference of means a two-group design with these spreads detects (95 %
    two-sided, 80 % power), Welch's standard error with the smaller group's df."""
    a = [x for x in a if x == x]
    b = [x for x in b if x == x]
    if len(a) < 2 or len(b) < 2:
        return math.nan
    va = sum((x - sum(a) / len(a)) ** 2 for x in a) / (len(a) - 1)
    vb = sum((x - sum(b) / len(b)) ** 2 for x in b) / (len(b) - 1)
    se = math.sqrt(va / len(a) + vb / len(b))
    df = min(len(a), len(b)) - 1
    return (_t(T975, df, 1.96) + _t(T80, df, 0.84)) * se


def sign_flip_p(d: list[float]) -> float:
    """Exact two-sided p-value of the mean of paired differences ``d`` under random signs."""
    if not d:
        return math.nan
    obs = abs(sum(d))
    hits = total = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        total += 1
        hits += abs(sum(s * x for s, x in zip(signs, d))) >= obs - 1e-12
    return hits / total


def one_sided_sign_flip_p(d: list[float]) -> float:
    """Exact one-sided p-value (mean of ``d`` > 0) under random signs."""
    if not d:
        return math.nan
    obs = sum(d)
    hits = total = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        total += 1
        hits += sum(s * abs(x) for s, x in zip(signs, d)) >= obs - 1e-12
    return hits / total


def bootstrap(values: list, stat, samples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of ``stat`` over resamples of ``values`` with replacement;
    resamples where stat is NaN are dropped."""
    rng = random.Random(seed)
    out = []
    for _ in range(samples):
        x = stat([rng.choice(values) for _ in values])
        if x == x:
            out.append(x)
    if not out:
        return math.nan, math.nan
    out.sort()
    return out[int(0.025 * (len(out) - 1))], out[int(0.975 * (len(out) - 1))]


def first_crossing(points: list[dict], key: str = "acc", level: float = 50.0,
                   also: str | None = None) -> float:  # fmt: skip
    """Tokens (millions) at the first point of ``points`` (each with "tokens") where ``key``
    (and ``also``, when given) is at least ``level``; NaN when the curve never gets there."""
    for p in sorted(points, key=lambda q: q["tokens"]):
        if p[key] >= level and (also is None or p[also] >= level):
            return p["tokens"] / 1e6
    return math.nan
