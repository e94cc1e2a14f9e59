"""Convolutions whose padding is not zero, on an accelerator whose DMA pads with zeros.

A QConv with ``pad_value`` z (graph/qops.py: the padding reads z, the input's zero point)
sums ``w * z`` over the taps of a window that fall in the padding; the DMA fills those taps
with 0 (docs/isa.md, LOAD). The difference is a constant of the output channel and of
*which* taps of the window are padding: ``z * sum(W[o, dy, dx])`` over those taps, with
``W[o, dy, dx] = sum_c w[o, c, dy, dx]``. Which taps are padding depends only on the output
row's *row class* (how many kernel rows fall off the top and the bottom) and the column's
column class, so the layer's int32 bias becomes a small table ``bias[o, row class, column
class]`` (the bias plus that correction; ``bias_table``), and the epilogue's bias ADD, which
already runs once per accumulator row, reads the entry of the row's class instead of the
channel's single one: exact, and no ALU or GEMM work is added.

Classes along one axis (``AxisClasses``): the first ``before`` output rows (whose windows
start in the padding) each have their own class, then one class for all the rows whose
window lies inside the image, then the last ``after`` rows (windows ending in the padding).
The class of row y is ``min(y, before) + max(0, y - (out - after - 1))``, an expression
the ALU's micro-ops evaluate per row (the bias ADD's micro-ops are unrolled over the rows
and columns of a tile instead of folded into the instruction's loops: a few hundred micro-ops,
loaded once while they stay in the micro-op buffer). When every row touches the padding
(a small image), the class is the row itself (``identity``): affine, so the loops fold and
only the tile's rows of the table are loaded. An axis without padding has one class (0).

Taps a convolution never uses (crop_taps, ops_group.py: kernel rows and columns that only
ever meet padding) are padding in every window: their ``z * W`` is part of every entry, so
the table is computed on the layer's own (uncropped) geometry and serves the cropped one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..tensor.expr import as_expr, max_expr, min_expr

__all__ = ["AxisClasses", "axis_classes", "bias_table", "pack_bias_table", "bias_rows",
           "bias_uops"]


@dataclass(frozen=True)
class AxisClasses:
    """The classes of one output axis of ``out`` positions (module doc)."""

    out: int
    before: int = 0
    after: int = 0

    @property
    def identity(self) -> bool:
        """Every position touches the padding: each its own class."""
        return self.before + self.after >= self.out

    @property
    def count(self) -> int:
        if not self.before and not self.after:
            return 1
        return self.out if self.identity else self.before + self.after + 1

    def rows(self, tile: int) -> int:
        """Table entries a tile of ``tile`` positions reads along this axis."""
        return tile if self.identity and self.count > 1 else self.count

    def of(self, y: np.ndarray) -> np.ndarray:
        """The class of each position ``y`` (numpy)."""
        y = np.asarray(y)
        if not self.before and not self.after:
            return np.zeros_like(y)
        if self.identity:
            return y
        return np.minimum(y, self.before) + np.maximum(0, y - (self.out - self.after - 1))

    def expr(self, y):
        """The class of position ``y`` (a loop expression), as the ALU's micro-ops compute it."""
        if not self.before and not self.after:
            return as_expr(0)
        if self.identity:
            return y
        c = min_expr(y, self.before) if self.before else as_expr(0)
        if self.after:
            c = c + max_expr(y - (self.out - self.after - 1), 0)
        return c


def _off(size: int, taps: int, stride: int, pad: int, out: int) -> np.ndarray:
    """[out, taps]: whether tap d of output position y reads padding."""
    pos = np.arange(out)[:, None] * stride + np.arange(taps)[None, :] - pad
    return (pos < 0) | (pos >= size)


def axis_classes(size: int, taps: int, stride: int, pad: int, out: int) -> AxisClasses:
    """The classes of an axis of ``size`` input positions read by ``taps`` kernel taps with
    ``stride`` and ``pad`` before (dilation 1), ``out`` outputs."""
    touches = _off(size, taps, stride, pad, out).any(axis=1)
    if not touches.any():
        return AxisClasses(out)
    inside = np.flatnonzero(~touches)
    if inside.size == 0:
        return AxisClasses(out, out, 0)
    before, after = int(inside[0]), int(out - 1 - inside[-1])
    assert not touches[before:out - after].any()  # off-top rows a prefix, off-bottom a suffix
    return AxisClasses(out, before, after)


def bias_table(bias: np.ndarray, w: np.ndarray, z: int, size: tuple, strides: tuple,
               pads: tuple, out: tuple) -> tuple[np.ndarray, AxisClasses, AxisClasses]:
    """(int32 [O, row classes, column classes], row classes, column classes): ``bias[o]`` plus
    ``z * W[o, dy, dx]`` summed over the taps each class's windows read in the padding.
    ``w`` [O, C/groups, KH, KW] int8, ``size`` (H, W), ``strides`` (rows, columns), ``pads``
    (top, left, bottom, right), ``out`` (OH, OW): the layer's own geometry (module doc).
    The sums wrap to int32 as the accumulator does."""
    kh, kw = w.shape[2:]
    rows = axis_classes(size[0], kh, strides[0], pads[0], out[0])
    cols = axis_classes(size[1], kw, strides[1], pads[1], out[1])
    off_y = _off(size[0], kh, strides[0], pads[0], out[0])
    off_x = _off(size[1], kw, strides[1], pads[1], out[1])
    # a representative position of each class
    ry = [int(np.flatnonzero(rows.of(np.arange(out[0])) == c)[0]) for c in range(rows.count)]
    rx = [int(np.flatnonzero(cols.of(np.arange(out[1])) == c)[0]) for c in range(cols.count)]
    wsum = w.astype(np.int64).sum(axis=1)  # [O, KH, KW]
    padded = off_y[ry][:, None, :, None] | off_x[rx][None, :, None, :]  # [cy, cx, KH, KW]
    corr = np.einsum("ohw,yxhw->oyx", wsum, padded.astype(np.int64)) * int(z)
    table = bias.astype(np.int64)[:, None, None] + corr
    return ((table + 2**31) % 2**32 - 2**31).astype(np.int32), rows, cols


def pack_bias_table(table: np.ndarray, b: int, k: int) -> np.ndarray:
    """[O, CY, CX] (O a multiple of k) -> (O/k, CY, CX, b, k), every batch lane alike: the
    accumulator rows of each output block's table entries."""
    o, cy, cx = table.shape
    t = table.reshape(o // k, k, cy, cx).transpose(0, 2, 3, 1)[:, :, :, None, :]
    return np.ascontiguousarray(np.broadcast_to(t, (o // k, cy, cx, b, k))).astype(np.int32)


def bias_rows(classes: tuple, tile_h: int, tile_w: int) -> int:
    """Accumulator rows of one output block's bias in a tile (1 without classes)."""
    if not classes:
        return 1
    rows, cols = classes
    return rows.rows(tile_h) * cols.rows(tile_w)


def bias_uops(classes: tuple, tile_h: int, tile_w: int) -> int:
    """Micro-ops of a tile's bias ADD with a table (0 without classes: the other ALU
    kernels' count): the rows and columns unrolled when a class is min/max of them."""
    if not classes:
        return 0
    rows, cols = classes
    if rows.count > 1 and not rows.identity:
        return tile_h * tile_w
    return tile_w
