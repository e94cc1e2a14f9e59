"""Calibration methods: how the int8 range of a value is chosen from its calibration samples.

``quantize_graph(..., method=...)`` takes one of ``METHODS``:

- ``"mse"`` (the default): the range of least squared rounding error, on the values never
  negative (quantize.py's ``_mse_ranges`` says where);
- ``"minmax"``: the calibrated max |x|;
- ``"percentile"``: the given percentile of |x| over the kept samples (``"percentile"``
  alone is 99.99; ``"percentile:99.9"`` or ``percentile=99.9`` sets it), never above the
  maximum, the maximum when it would be 0;
- ``"entropy"``: TensorRT's KL-divergence search: a 2048-bin histogram of |x| over [0,
  max] (the first bin, where a Relu output's zeros pile up, counted as the second, as
  NVIDIA's pytorch-quantization does); for every threshold bin i from the number of int8 levels (128 on a symmetric
  scale, 256 with a zero point) to 2048, the reference distribution P (bins below i, the
  outliers beyond added to its last bin) against Q, P merged into the int8 levels and
  spread back over its nonzero bins; the threshold of least KL(P || Q), ``(i + 0.5) *
  bin width`` (never above the maximum).

The percentile and entropy methods apply to every value (signed ones on |x|), as
onnxruntime's calibrators of those names do; both read the evenly strided elements
calibration keeps of each value (about 20000 per sample), so a percentile is of those.
"""

from __future__ import annotations

import math

import numpy as np

from .ir import GraphError

METHODS = ("mse", "minmax", "percentile", "entropy")
DEFAULT_PERCENTILE = 99.99
_BINS = 2048


class CalibrationError(GraphError):
    """Calibration that cannot be done as asked: samples that do not fit the graph (which
    input, expected vs got), an unknown method or a bad percentile. (quantize.py exports
    it.)"""


def parse_method(method, percentile: float | None = None) -> tuple[str, float | None]:
    """(method name, percentile or None) from ``method`` ("mse", "minmax", "percentile",
    "percentile:P", "entropy") and an optional ``percentile`` keyword (only with
    "percentile"). Raises CalibrationError saying what is accepted."""
    if not isinstance(method, str):
        raise CalibrationError(f"calibration method {method!r} is not a string: choose one of "
                          f"{', '.join(METHODS)} (or 'percentile:P', e.g. 'percentile:99.9')")
    name, sep, arg = method.strip().partition(":")
    name = name.strip().lower()
    if name not in METHODS:
        raise CalibrationError(f"unknown calibration method {method!r}: choose one of "
                          f"{', '.join(METHODS)} (or 'percentile:P', e.g. 'percentile:99.9')")
    if name != "percentile":
        if sep or percentile is not None:
            raise CalibrationError(f"calibration method {name!r} takes no percentile (given "
                              f"{arg.strip() if sep else percentile!r}); a percentile goes "
                              f"with 'percentile'")
        return name, None
    if sep and percentile is not None:
        raise CalibrationError(f"the percentile is given twice ({method!r} and percentile="
                          f"{percentile!r}): give it once")
    value = arg.strip() if sep else percentile
    if value is None:
        return name, DEFAULT_PERCENTILE
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise CalibrationError(f"calibration percentile {value!r} is not a number: give one in "
                          f"(0, 100], e.g. 'percentile:99.99'") from None
    if not (0 < p <= 100) or math.isnan(p):
        raise CalibrationError(f"calibration percentile {p:g} is outside (0, 100]: give e.g. "
                          f"99.99 (the share of |x| kept inside the range, in percent)")
    return name, p


def percentile_range(values: np.ndarray, top: float, p: float) -> float:
    """The p-th percentile of |values|, at most ``top``; ``top`` when it is 0 (a value
    that is mostly exactly 0: any range represents those, the rest need the maximum)."""
    if values.size == 0 or top <= 0:
        return top
    t = float(np.percentile(np.abs(values.astype(np.float64)), p))
    return min(t, top) if t > 0 else top


def entropy_range(values: np.ndarray, top: float, levels: int = 128,
                  bins: int = _BINS) -> float:
    """TensorRT's KL-divergence threshold of |values| over [0, top] (module doc) for
    ``levels`` int8 steps on [0, threshold]."""
    if values.size == 0 or top <= 0:
        return top
    hist = np.histogram(np.abs(values.astype(np.float64)), bins=bins, range=(0.0, top))[0]
    hist = hist.astype(np.float64)
    hist[0] = hist[1]  # the spike of exact zeros (Relu outputs) would pull the threshold in
    width = top / bins
    best_i, best_kl = bins, math.inf
    tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # tail[i] = sum hist[i:]
    for i in range(levels, bins + 1):
        p = hist[:i].copy()
        p[-1] += tail[i]
        if p.sum() <= 0:
            continue
        # Q: the first i bins merged into `levels` groups, each group's total spread
        # evenly over its nonzero bins (an empty bin of P stays empty in Q).
        edges = (np.arange(levels + 1) * i) // levels
        group = np.repeat(np.arange(levels), np.diff(edges))
        src = hist[:i]
        nonzero = p > 0
        totals = np.bincount(group, weights=src, minlength=levels)
        counts = np.bincount(group, weights=nonzero.astype(np.float64), minlength=levels)
        q = np.where(nonzero, totals[group] / np.maximum(counts[group], 1), 0.0)
        kl = _kl(p, q)
        if kl < best_kl:
            best_i, best_kl = i, kl
    return min(top, (best_i + 0.5) * width)


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL(P || Q) of two histograms, normalized. Where P has mass and Q none (the outliers
    added to P's last bin when Q's last group was empty), Q gets a small share (1e-4 of
    its least nonzero one, MXNet's smoothing) so the divergence stays finite."""
    p = p / p.sum()
    if q.sum() <= 0:
        return math.inf
    m = p > 0
    hole = m & (q <= 0)
    if hole.any():
        q = np.where(hole, 1e-4 * q[q > 0].min(), q)
    q = q / q.sum()
    return float((p[m] * np.log(p[m] / q[m])).sum())
