"""Medians and their spread, for benchmarks that time runtimes against each other.

Timings on a shared machine are noisy, so every benchmark that compares runtimes reports
the median of repeated, interleaved runs with its interquartile range (IQR: the 75th minus
the 25th percentile) and how many samples it is over. A ratio between two runtimes timed
in alternating blocks is also given per block (the ratio of the two blocks' medians): the
median of those and their IQR say how much the ratio itself moves across the run.
"""

from __future__ import annotations

import numpy as np

__all__ = ["summary", "summary_ms", "block_ratios"]


def summary(values) -> dict:
    """Median, 25th and 75th percentiles, IQR, minimum and maximum of values (in their own
    unit: a rate, a ratio), and their count."""
    v = np.asarray(values, np.float64)
    p25, p50, p75 = np.percentile(v, [25, 50, 75])
    return {"median": float(p50), "p25": float(p25), "p75": float(p75),
            "iqr": float(p75 - p25), "min": float(v.min()), "max": float(v.max()),
            "samples": int(v.size)}


def summary_ms(samples) -> dict:
    """Median, 25th and 75th percentiles, IQR and minimum (ms) of samples in seconds, and
    their count."""
    s = summary(np.asarray(samples, np.float64) * 1e3)
    return {**{f"{k}_ms": s[k] for k in ("median", "p25", "p75", "iqr", "min")},
            "samples": s["samples"]}


def block_ratios(ours: list, theirs: list, per_block: int) -> dict:
    """The ratio of two runtimes' block medians (ours / theirs), block by block (samples in
    order, ``per_block`` to a block): median, IQR and count."""
    a = np.asarray(ours, np.float64).reshape(-1, per_block)
    b = np.asarray(theirs, np.float64).reshape(-1, per_block)
    r = np.median(a, axis=1) / np.median(b, axis=1)
    p25, p50, p75 = np.percentile(r, [25, 50, 75])
    return {"median": float(p50), "iqr": float(p75 - p25), "blocks": int(r.size)}
