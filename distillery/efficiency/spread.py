"""A speedup is a measurement with its spread: the median of paired rounds' ratios beside their 10th and 90th
percentiles (`distillery.efficiency.latency.measure_latency`), and how reports say it. The report and the summary's
readers use it too."""

from __future__ import annotations

#: the widest spread a speedup is reported with: the 10th-90th percentile range of its per-round ratios over their
#: median; wider, the rounds disagree too much to say (a busy machine, or a runtime whose calls vary; the result's
#: `resolved` is False). A quiet machine's rounds spread far less, a second process on one of its cores twice as much
MAX_SPREAD = 0.25


def spread_of(speedup: float | None, low: float | None, high: float | None) -> float | None:
    """(p90 - p10) / median of a speedup's per-round ratios; None when any is missing or the median is not positive."""
    if not all(isinstance(v, (int, float)) for v in (speedup, low, high)) or not speedup > 0:
        return None
    return (high - low) / speedup


def resolved(speedup: float | None, low: float | None, high: float | None) -> bool:
    """Whether the rounds agree closely enough (`MAX_SPREAD`) for the speedup to be reported as a figure."""
    spread = spread_of(speedup, low, high)
    return spread is not None and spread <= MAX_SPREAD


def describe_speedup(speedup: float | None, low: float | None, high: float | None) -> str:
    """"2.6x [2.5-2.7]": a speedup with the 10th-90th percentiles of its rounds; "unresolved [1.2-4.0x]" when they
    spread wider than `MAX_SPREAD` (the rounds disagree too much to say); "-" without one."""
    if not all(isinstance(v, (int, float)) for v in (speedup, low, high)):
        return "-" if not isinstance(speedup, (int, float)) else f"{speedup:.1f}x"
    if resolved(speedup, low, high):
        return f"{speedup:.1f}x [{low:.1f}-{high:.1f}]"
    return f"unresolved [{low:.1f}-{high:.1f}x]"
