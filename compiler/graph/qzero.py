"""Zero points for int8 activations where the integer operators already take them exactly.

A value of scale s and zero point z is stored as ``q = clip(rint(v / s) + z, -128, 127)``
and means ``s * (q - z)``. The quantized operators (qops.py) have no zero-point attribute;
a zero point is used only where folding it into constants the operators already have is
exact (or as close as the symmetric scheme's own rounding), so qops.py, the compiled CPU
kernels and the accelerator compute the same bits as before:

- a QConv/QGemm *writing* the value adds ``z_out`` after its shift: ``rint(z_out / r[o])``
  more in its int32 bias (r[o] the requantization ratio), its clamp [lo, hi] moved by z_out;
  off from the exact z_out by the ratio's own rounding (``r/2`` of an output step). One
  with a residual adds nothing: the residual, of the output's class, brings z_out (``y - z
  = t + (r - z)``), exact;
- a QConv/QGemm *reading* it subtracts ``z_in * sum(w_q[o])`` from its bias: exact, ``sum w
  (q - z) = sum w q - z sum w``. A padded QConv's padding reads ``z_in`` (its ``pad_value``,
  qops.py; the accelerator adds what its zero-filling DMA leaves out to a bias table,
  compiler/accel/border.py), so its border windows are exact too;
- a QLut's table is indexed by q and filled from ``s_in (q - z_in)``, into ``z_out``;
- a QGlobalAveragePool (its own output scale) folds ``z_out - z_in * s_in / s_out`` into
  its rounding constant (``offset``, within its rounding);
- MaxPool (its padding fill -128 is below any value), Flatten, Reshape, Transpose, Identity
  and Concat keep it.

- a Quantize writing it (from a float value) and a Dequantize reading it (for a float
  reader) take it as their ``zero_point`` attribute (they run on the CPU, qops.py and the
  compiled CPU kernels alike).

- a QMul or QAdd (their ``zero_points`` [za, zb, zo], qops.py; the accelerator's ALU
  programs take them, compiler/accel/ops_alu.py) reads and writes them: ``(a - za) * (b -
  zb)`` or ``(a - za) * ma + (b - zb) * mb``, zo added after the shift;

Everything else keeps zero points 0: QMatMul (no offset step), Relu on int8 (clamps at
0) and a graph output. ``asymmetric_classes`` finds the scale classes whose
every writer and reader is of the first kinds.
"""

from __future__ import annotations

import math

import numpy as np

from .ir import Graph

# Ops that carry a zero point through unchanged (on int8, in the input's scale).
_KEEPS_ZERO = ("MaxPool", "Flatten", "Reshape", "Transpose", "Identity", "Concat", "Slice",
               "Pad")  # (an int8 Pad only moves values: a zero Pad pads the zero point)


def _reads_ok(graph: Graph, node, value: str, kind: str, layer) -> bool:
    """Whether ``node`` (of plan kind ``kind``) can read ``value`` with a zero point."""
    if kind == "layer":
        at = [k for k, i in enumerate(node.inputs) if i == value]
        # as its data (z taken off through the bias) or its residual (one class with the
        # output: it carries the output's zero point, see _writes_ok)
        # (or the operand of the QMul after its table: QMul takes zero points)
        after = bool(layer.after) and layer.after[2] == value
        if after:
            return all(k != 0 for k in at)
        return all(k == 0 or value == layer.residual for k in at)
    if kind == "same":
        return node.op in _KEEPS_ZERO
    return kind in ("pool", "lut", "binary")


def _writes_ok(node, kind: str, layer) -> bool:
    """Whether ``node`` can write its output with a zero point."""
    if kind == "layer":
        return True
    if kind == "same":
        return node.op in _KEEPS_ZERO
    return kind in ("pool", "lut", "binary")


def asymmetric_classes(graph: Graph, kinds: dict, layers: dict, classes, int8: set,
                       quantized=frozenset()) -> set:
    """The roots of the scale classes (union-find ``classes``) that may take a zero point:
    every member an int8 value of the graph written by a node that can add one (or a float
    value a Quantize converts, ``quantized``) and read only by nodes that can take one
    (module doc)."""
    producers, consumers = graph.producers(), graph.consumers()
    members: dict[str, list] = {}
    for v in set(int8) | set(quantized):
        members.setdefault(classes.find(v), []).append(v)
    out = set()
    for root, values in members.items():
        ok = True
        for v in values:
            p = producers.get(v)
            if v in quantized and v not in int8:
                pass  # a float writer: the Quantize adds the zero point
            elif p is None or v in graph.outputs or p.name not in kinds or \
                    not _writes_ok(p, kinds[p.name], layers.get(p.name)):
                ok = False
                break
            for c in consumers.get(v, ()):
                # a float reader reads it through a Dequantize, which takes the zero point
                if c.name in kinds and not _reads_ok(graph, c, v, kinds[c.name],
                                                     layers.get(c.name)):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            out.add(root)
    return out


def affine(lo: float, hi: float) -> tuple[float, int]:
    """(scale as float32, zero point) of the range [lo, hi] (widened to hold 0, so 0 is
    exact): 256 steps from lo to hi."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo <= 0:
        return float(np.float32(1 / 127)), 0
    s = float(np.float32((hi - lo) / 255))
    z = int(np.clip(-128 - np.rint(lo / s), -128, 127))
    return s, z


def quantize_affine(v: np.ndarray, s: float, z: int) -> np.ndarray:
    """The int8 values of float ``v`` in scale s, zero point z, as float64 dequantized."""
    return (np.clip(np.rint(v / s) + z, -128, 127) - z) * s


def mse_top(values: np.ndarray, top: float, lowest: float) -> float:
    """For a non-negative value: the upper end in [lowest * top, top] of the range [0, t]
    whose 256-step rounding (values beyond clipped) has the least mean squared error."""
    if top <= 0 or values.size == 0:
        return top
    v = values.astype(np.float64)
    best, best_err = top, math.inf
    for t in np.linspace(lowest, 1.0, 57) * top:
        s, z = affine(0.0, t)
        err = float(((quantize_affine(v, s, z) - v) ** 2).mean())
        if err < best_err:
            best, best_err = t, err
    return best
