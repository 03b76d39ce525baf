"""The statistics the regime study's reports print: exact intervals for seed shares (Clopper-
Pearson, Jeffreys), paired comparisons over seeds (mean, standard error, an exact sign-flip
test), bootstrap intervals, and the exact distributions the verdict rule needs (Student t, Beta,
the noncentral t behind the smallest detectable difference; verdicts.py).

Plain Python (no scipy): the seed counts are small (3 to 6), so exact enumeration is cheap.
When the memory emerged is emergence.py's (a censored time).
"""

from __future__ import annotations

import functools
import itertools
import math
import random

# Student t quantiles by degrees of freedom (two-sided 95 %: 0.975; one-sided 80 % power: 0.80)
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}
T80 = {
    1: 1.376,
    2: 1.061,
    3: 0.978,
    4: 0.941,
    5: 0.920,
    6: 0.906,
    7: 0.896,
    8: 0.889,
    9: 0.883,
    10: 0.879,
    15: 0.866,
    20: 0.860,
    30: 0.854,
}


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
    smallest difference the design detects (95 % two-sided, 80 % power: (t.975 + t.80) × SE,
    the approximation the text study's fixed rule uses; the claims' verdicts use mde_se),
    the exact two-sided sign-flip p-value, and n."""
    d = [x - y for x, y in zip(a, b) if x == x and y == y]
    n = len(d)
    if n == 0:
        return {
            "mean": math.nan,
            "se": math.nan,
            "ci": (math.nan, math.nan),
            "mde": math.nan,
            "p": math.nan,
            "n": 0,
        }
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


# ------------------------------------------------------------------------------ distributions
# Exact where the verdicts need them (the verdict rule, verdicts.py; rho*'s interval): the
# regularized incomplete beta function (the binomial, Beta and Student t distributions) and the
# noncentral t (the power of a paired t test). Plain Python: the package needs no scipy.


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Lentz's continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1.0 - betainc(b, a, 1.0 - x)
    log_front = a * math.log(x) + b * math.log1p(-x) - math.log(a) - _log_beta(a, b)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 1000):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _solve(f, lo: float, hi: float, iters: int = 100) -> float:
    """The root of an increasing ``f`` in [lo, hi], by bisection."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def beta_quantile(q: float, a: float, b: float) -> float:
    """The q quantile of Beta(a, b)."""
    return _solve(lambda x: betainc(a, b, x) - q, 0.0, 1.0)


def jeffreys(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Jeffreys interval of a binomial share k / n, in %: the equal-tailed interval of the
    Beta(k + 1/2, n - k + 1/2) posterior, with the lower end 0 at k = 0 and the upper end 100
    at k = n (Brown, Cai and DasGupta 2001)."""
    if n == 0:
        return math.nan, math.nan
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else beta_quantile(a, k + 0.5, n - k + 0.5)
    hi = 1.0 if k == n else beta_quantile(1 - a, k + 0.5, n - k + 0.5)
    return 100 * lo, 100 * hi


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + x * x))
    return 1.0 - tail if x > 0 else tail


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, df: float) -> float:
    """The q quantile of Student's t with ``df`` degrees of freedom."""
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_quantile(1 - q, df)
    hi = 1.0
    while t_cdf(hi, df) < q:
        hi *= 2
    return _solve(lambda x: t_cdf(x, df) - q, 0.0, hi)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def nct_cdf(x: float, df: float, nc: float, steps: int = 2000) -> float:
    """P(T <= x) for the noncentral t with ``df`` degrees of freedom and noncentrality ``nc``,
    T = (Z + nc) / S with S = sqrt(chi2_df / df): the integral of Phi(x s - nc) over the density
    of S (Simpson's rule on [0, s_max], where the density has fallen below 1e-30)."""
    log_c = (df / 2) * math.log(df / 2) + math.log(2) - math.lgamma(df / 2)
    s_max = 1 + 16 / math.sqrt(df)

    def g(s: float) -> float:
        if s == 0.0:
            dens = math.exp(log_c) if df == 1 else 0.0
        else:
            dens = math.exp(log_c + (df - 1) * math.log(s) - df * s * s / 2)
        return _phi(x * s - nc) * dens

    h = s_max / steps
    total = g(0.0) + g(s_max)
    for i in range(1, steps):
        total += (4 if i % 2 else 2) * g(i * h)
    return total * h / 3


def t_power(nc: float, df: float, level: float = 0.95) -> float:
    """Power of the two-sided t test at ``level`` when the true effect is ``nc`` standard
    errors."""
    tc = t_quantile(1 - (1 - level) / 2, df)
    return 1.0 - nct_cdf(tc, df, nc) + nct_cdf(-tc, df, nc)


@functools.lru_cache(maxsize=256)
def mde_se(n: int, power: float = 0.8, level: float = 0.95) -> float:
    """The smallest true mean difference, in standard errors, that a paired t test on ``n``
    pairs detects with ``power`` (two-sided, ``level``): the exact noncentral t value
    (the approximation t_.975 + t_.80 is about 2 % smaller at n = 4)."""
    if n < 2:
        return math.nan
    df = n - 1
    hi = 1.0
    while t_power(hi, df, level) < power:
        hi *= 2
    return _solve(lambda nc: t_power(nc, df, level) - power, 0.0, hi, iters=40)


def sign_test_p(k: int, m: int) -> tuple[float, float]:
    """Exact sign test of k pairs one way and m the other (ties left out): (one-sided p of
    "k or more of k + m", two-sided p)."""
    n = k + m
    if n == 0:
        return math.nan, math.nan
    one = sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n
    far = max(k, m)
    two = min(1.0, 2 * sum(math.comb(n, i) for i in range(far, n + 1)) / 2**n)
    return one, two
