"""The int8 range of a lookup table's input: clipped where the table's function is flat.

A layer whose epilogue ends in a function with no exact int8 form (HardSwish, SiLU,
Sigmoid, HardSigmoid, GELU, ...) writes its pre-activation as an intermediate int8 value
that a QLut reads (quantize.py). That value used to take the symmetric range of its largest
magnitude, as any signed value: half of its 256 steps went to the negative side, where
these functions are flat (HardSwish is 0 below -3, SiLU within 0.015 of 0 below -6, a gate
saturates at both ends), and MobileNetV3's pre-HardSwish values got steps twice as coarse
as the HardSwish outputs written from them. Only the table reads the value, so what
matters is the table's output: ``table_input_range`` moves each end of the calibrated
range [min, max] in as far as ``f`` beyond it stays within half an output step of its
value there (the output step: f's range over [min, max] / 255), and gives the value those
256 steps with a zero point. Whatever is clipped then maps to within half a step of what
the table gives for it; nothing is clipped where ``f`` still changes (a least-squares
choice of the range that also cut into the largest values measured worse on a transformer,
all-MiniLM-L6: its GELU inputs' outliers matter). The QConv/QGemm writing the value adds
the zero point through its bias (qzero.py) and the table is filled from ``s * (q - z)``:
the integer operators and the accelerator's programs are unchanged; only their constants
differ. Measured: docs/graph.md ("Accuracy against onnxruntime's quantizer, continued").
"""

from __future__ import annotations

import numpy as np

from .qzero import affine

__all__ = ["table_input_range"]

# The grid f is evaluated on between the calibrated extremes.
_GRID = 4097


def table_input_range(f, lo: float, hi: float):
    """(scale, zero point, lo', hi') of the int8 input of the element-wise function ``f``
    (float32 array -> array) whose calibrated extremes are ``lo`` <= 0 <= ``hi`` (module
    doc): [lo', hi'] within [lo, hi], each end moved in as far as ``f`` beyond it stays
    within half an output step (its range over [lo, hi] / 255 / 2) of its value there;
    None when ``f`` is not finite on [lo, hi] or constant there."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not hi > lo:
        return None
    grid = np.linspace(lo, hi, _GRID).astype(np.float32)
    with np.errstate(all="ignore"):
        y = np.asarray(f(grid), np.float64)
    if y.shape != grid.shape or not np.isfinite(y).all():
        return None
    tol = (y.max() - y.min()) / 255 / 2
    if tol <= 0:
        return None
    # lo': the largest grid point <= 0 with |f(x) - f(lo')| <= tol for every x below it
    run_max, run_min = np.maximum.accumulate(y), np.minimum.accumulate(y)
    ok = (run_max - y <= tol) & (y - run_min <= tol) & (grid <= 0)
    a = float(grid[np.nonzero(ok)[0].max()]) if ok.any() else lo
    tail_max = np.maximum.accumulate(y[::-1])[::-1]
    tail_min = np.minimum.accumulate(y[::-1])[::-1]
    ok = (tail_max - y <= tol) & (y - tail_min <= tol) & (grid >= 0)
    b = float(grid[np.nonzero(ok)[0].min()]) if ok.any() else hi
    s, z = affine(a, b)
    return s, z, a, b
