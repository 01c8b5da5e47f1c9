"""A speedup is a measurement with its spread: the median of paired rounds' ratios beside their 10th and 90th
percentiles (`distillery.efficiency.latency.measure_latency`), the interval that holds the median with 95% confidence,
and how reports say it. The report and the summary's readers use it too.

A speedup is reported as a figure when its median is known closely enough: the distribution-free 95% interval of the
median (two order statistics of the rounds' ratios) within `MAX_UNCERTAINTY` of it. The rounds' own spread (p10-p90)
is printed beside the figure; it says how much one round differs from the next, which more rounds do not narrow, while
the median's interval narrows as rounds are added (`time_sessions` adds them while a speedup is unresolved). Rows
written before the interval was kept (the results log's older runs) are judged by their rounds' spread
(`MAX_SPREAD`), as they were reported then."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

#: the widest the 95% interval of a speedup's median may be, on either side, as a share of the median, for the
#: speedup to be reported as a figure; wider, the rounds do not pin the median down (a busy machine, or a runtime
#: whose calls vary: the result's `resolved` is False)
MAX_UNCERTAINTY = 0.15
#: rows without the median's interval: the widest 10th-90th percentile range of the rounds' ratios over their median
MAX_SPREAD = 0.25
#: the keys of a speedup in a summary row, each followed by the row's suffix (e.g. ``_b1_int8``)
KEYS = ("speedup", "speedup_p10", "speedup_p90", "speedup_ci_low", "speedup_ci_high")


def speed_of(row: Mapping[str, Any], suffix: str = "") -> tuple:
    """(median, p10, p90, low, high) of the speedup ``speedup{suffix}`` of a summary row (None where missing)."""
    return tuple(row.get(f"{k}{suffix}") for k in KEYS)


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free interval that holds the median of the population `values` were drawn from with at
    least `confidence`: the j-th smallest and j-th largest value, j the largest rank with P(Binomial(n, 1/2) < j) <=
    (1 - confidence) / 2. None for fewer values than any such interval needs (6 at 95%)."""
    xs, n = sorted(values), len(values)
    tail, j, below = (1 - confidence) / 2, 0, 0.0
    while j < n and below + math.comb(n, j) / 2 ** n <= tail:
        below += math.comb(n, j) / 2 ** n
        j += 1
    return (xs[j - 1], xs[n - j]) if j else None


def spread_of(speedup: float | None, low: float | None, high: float | None) -> float | None:
    """(p90 - p10) / median of a speedup's per-round ratios; None when any is missing or the median is not positive."""
    if not all(isinstance(v, (int, float)) for v in (speedup, low, high)) or not speedup > 0:
        return None
    return (high - low) / speedup


def uncertainty(speedup: float | None, low: float | None, high: float | None) -> float | None:
    """How far the median's interval [low, high] reaches from the median, as a share of it (the larger side)."""
    if not all(isinstance(v, (int, float)) for v in (speedup, low, high)) or not (speedup > 0 and low > 0):
        return None
    return max(speedup / low, high / speedup) - 1


def resolved(speedup: float | None, p10: float | None, p90: float | None, low: float | None = None,
             high: float | None = None) -> bool:
    """Whether the speedup is known closely enough to be reported as a figure: its median's interval within
    `MAX_UNCERTAINTY`; without an interval (an older row), its rounds' spread within `MAX_SPREAD`."""
    if low is None and high is None:
        spread = spread_of(speedup, p10, p90)
        return spread is not None and spread <= MAX_SPREAD
    u = uncertainty(speedup, low, high)
    return u is not None and u <= MAX_UNCERTAINTY


def describe_speedup(speedup: float | None, p10: float | None, p90: float | None, low: float | None = None,
                     high: float | None = None) -> str:
    """"2.6x [2.5-2.7]": a speedup with the 10th-90th percentiles of its rounds; "unresolved [1.2-4.0x]" when its
    median is not known closely enough (`resolved`); "-" without one."""
    if not all(isinstance(v, (int, float)) for v in (speedup, p10, p90)):
        return "-" if not isinstance(speedup, (int, float)) else f"{speedup:.1f}x"
    if resolved(speedup, p10, p90, low, high):
        return f"{speedup:.1f}x [{p10:.1f}-{p90:.1f}]"
    return f"unresolved [{p10:.1f}-{p90:.1f}x]"
