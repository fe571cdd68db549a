"""Statistics for comparing arms across seeds, in pure Python (no scipy at run time; the tests check every number
against scipy): Student's t distribution, t-intervals, Welch's and the paired t-test, and the power of a two-sided
t-test from the noncentral t distribution (for "how many seeds would show this effect")."""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.05
POWER = 0.8


# -- distributions ---------------------------------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom."""
    if math.isinf(df):
        return 0.5 * math.erfc(t / math.sqrt(2.0))
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_cdf(t: float, df: float) -> float:
    return 1.0 - t_sf(t, df)


def t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t (bisection on the CDF, then to machine precision)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q} outside (0, 1)")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def _norm_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def nct_cdf(t: float, df: float, nc: float, points: int = 1200) -> float:
    """P(T' <= t) for the noncentral t with df degrees of freedom and noncentrality nc:
    T' = (Z + nc) / sqrt(V / df), so P(T' <= t) = E[Phi(t * S - nc)] with S = sqrt(V / df), V ~ chi2(df).
    Integrated over S's density (Simpson's rule on where it has mass)."""
    k = df
    log_c = (1.0 - k / 2.0) * math.log(2.0) - math.lgamma(k / 2.0) + (k / 2.0) * math.log(k)

    def density(s: float) -> float:  # the density of S = sqrt(chi2_k / k)
        if s <= 0.0:
            return 0.0
        return math.exp(log_c + (k - 1.0) * math.log(s) - k * s * s / 2.0)

    sd = math.sqrt(1.0 / (2.0 * k))  # S concentrates around 1 with this spread for large k
    lo = max(0.0, 1.0 - 12.0 * sd - 0.5 / math.sqrt(k))
    hi = 1.0 + 14.0 * sd + 2.0 / math.sqrt(k) + (3.0 if k < 3 else 0.0)
    if k <= 2:
        lo, hi = 0.0, 40.0
    # s = u * u puts the nodes close together near s = 0, where a small k's mass (and a large |t|'s step) lies
    ulo, uhi = math.sqrt(lo), math.sqrt(hi)
    n = points if points % 2 == 0 else points + 1
    h = (uhi - ulo) / n
    total = 0.0
    for i in range(n + 1):
        u = ulo + i * h
        s = u * u
        w = 1.0 if i in (0, n) else (4.0 if i % 2 else 2.0)
        total += w * 2.0 * u * density(s) * _norm_cdf(t * s - nc)
    return min(max(total * h / 3.0, 0.0), 1.0)


# -- summaries and tests ---------------------------------------------------------------------------------------

def mean(xs: list[float]) -> float:
    return math.fsum(xs) / len(xs)


def sample_sd(xs: list[float]) -> float:
    if len(xs) < 2:
        return math.nan
    m = mean(xs)
    return math.sqrt(math.fsum((x - m) * (x - m) for x in xs) / (len(xs) - 1))  # x*x: inf, never OverflowError


@dataclass
class Interval:
    mean: float
    low: float
    high: float
    n: int
    sd: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0


def t_interval(xs: list[float], level: float = 0.95) -> Interval:
    """Mean and its t-interval across seeds; one seed gives an unbounded interval (nan)."""
    n = len(xs)
    m = mean(xs)
    if n < 2:
        return Interval(m, math.nan, math.nan, n, math.nan)
    sd = sample_sd(xs)
    half = t_ppf(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(m, m - half, m + half, n, sd)


@dataclass
class TestResult:
    kind: str  # "welch" | "paired"
    diff: float  # mean(b) - mean(a)
    low: float
    high: float
    t: float
    df: float
    p: float
    effect: float  # standardized effect (Cohen's d for welch, d_z for paired)
    seeds_needed: int | None  # per arm, for 80% power at alpha 0.05 to see `effect`
    degenerate: bool = False  # zero variance (identical paired differences, constant arms): t and p measure no noise

    @property
    def significant(self) -> bool:
        """p < alpha; never for a degenerate test, whose p (0, or undefined) says nothing about chance."""
        return self.p < ALPHA and not self.degenerate


def no_spread(values: list[float], sd: float) -> bool:
    """Zero variance, up to the rounding of values this large (the differences of means of equal-spaced rewards
    differ in their last bits): scipy then warns of catastrophic cancellation and answers t = 1e16."""
    scale = max((abs(x) for x in values), default=0.0)
    return sd == 0.0 or sd <= 1e-12 * scale


def _degenerate(kind: str, diff: float, df: float) -> TestResult:
    """The test at zero variance, as scipy answers it: t = +-inf and p = 0 for a nonzero difference, t and p
    undefined (nan) for none; no interval but the point, no effect size, no seed count."""
    if diff == 0.0:
        t, p = math.nan, math.nan
    else:
        t, p = math.copysign(math.inf, diff), 0.0
    return TestResult(kind, diff, diff, diff, t, df, p, math.nan, None, degenerate=True)


def welch(a: list[float], b: list[float], level: float = 0.95) -> TestResult:
    """Welch's t-test of mean(b) - mean(a) (unequal variances), with its interval (Welch-Satterthwaite df)."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        raise ValueError("Welch's t-test needs at least 2 values per arm")
    sa, sb = sample_sd(a), sample_sd(b)
    diff = mean(b) - mean(a)
    if no_spread(a, sa) and no_spread(b, sb):
        return _degenerate("welch", diff, math.nan)
    va, vb = sa * sa / na, sb * sb / nb
    se = math.sqrt(va + vb)
    df = (va + vb) * (va + vb) / (va * va / (na - 1) + vb * vb / (nb - 1))
    t = diff / se
    p = min(1.0, 2.0 * t_sf(abs(t), df))
    half = t_ppf(0.5 + level / 2.0, df) * se
    pooled = math.sqrt(((na - 1) * sa * sa + (nb - 1) * sb * sb) / (na + nb - 2))
    d = diff / pooled if pooled > 0 else math.inf
    return TestResult("welch", diff, diff - half, diff + half, t, df, p, d, seeds_needed(d, paired=False))


def paired(a: list[float], b: list[float], level: float = 0.95) -> TestResult:
    """The paired t-test of b - a (the same seed and data order in both arms)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("the paired t-test needs the same number (>= 2) of values in both arms")
    d = [y - x for x, y in zip(a, b, strict=True)]
    n = len(d)
    m, sd = mean(d), sample_sd(d)
    if no_spread([*a, *b], sd):
        return _degenerate("paired", m, float(n - 1))
    se = sd / math.sqrt(n)
    t = m / se
    p = min(1.0, 2.0 * t_sf(abs(t), n - 1))
    half = t_ppf(0.5 + level / 2.0, n - 1) * se
    dz = m / sd
    return TestResult("paired", m, m - half, m + half, t, float(n - 1), p, dz, seeds_needed(dz, paired=True))


def power(effect: float, n: int, paired: bool = False, alpha: float = ALPHA) -> float:
    """The power of the two-sided t-test with n seeds per arm to detect a standardized effect (Cohen's d, or d_z
    when paired), from the noncentral t distribution."""
    if n < 2:
        return math.nan
    if paired:
        df, nc = n - 1.0, effect * math.sqrt(n)
    else:
        df, nc = 2.0 * n - 2.0, effect * math.sqrt(n / 2.0)
    crit = t_ppf(1.0 - alpha / 2.0, df)
    return (1.0 - nct_cdf(crit, df, nc)) + nct_cdf(-crit, df, nc)


def seeds_needed(effect: float, paired: bool = False, target: float = POWER, alpha: float = ALPHA,
                 limit: int = 100_000) -> int | None:
    """The smallest number of seeds per arm whose two-sided t-test has `target` power for this effect; None when
    the effect is zero (no number of seeds shows it) or needs more than `limit`."""
    if not math.isfinite(effect):
        return 2 if effect else None
    if abs(effect) < 1e-9:
        return None
    e = abs(effect)
    z = t_ppf(1.0 - alpha / 2.0, math.inf) + t_ppf(target, math.inf)
    n = max(2, math.ceil((z / e) ** 2 * (1.0 if paired else 2.0)))  # the normal approximation, then exact steps
    if n > limit:
        return None
    while power(e, n, paired, alpha) < target:
        n += 1
        if n > limit:
            return None
    while n > 2 and power(e, n - 1, paired, alpha) >= target:
        n -= 1
    return n
