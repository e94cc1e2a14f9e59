"""numpy definitions of the operators vision and detection models bring: GridSample and
AffineGrid (spatial transformers), RoiAlign, MaxRoiPool and NonMaxSuppression (detection
heads), LRN, LpPool, GlobalLpPool, MaxUnpool, Col2Im, DeformConv, CenterCropPad and
MeanVarianceNormalization. ops.py merges ``KERNELS`` and ``SHAPE_RULES`` into its tables.

Canonical attributes (frontend/canonical.py): every attribute explicit (its opset's
default filled in), GridSample's modes by their opset-20 names (linear, cubic), shape-like
inputs as attributes (AffineGrid's ``size``, MaxUnpool's ``output_shape``, Col2Im's
``image_shape`` and ``block_shape``, CenterCropPad's ``shape`` with ``axes`` non-negative),
LpPool's window as for the other pools (explicit pads and strides). NonMaxSuppression's
output size depends on its inputs' values: it runs in ONNX's form, typed
[?, 3] (graph/dynamic.py) unless every input is known at import.

Where onnxruntime and onnx's reference evaluator differ this follows onnxruntime: MaxUnpool's
indices address the ``output_shape`` tensor; GridSample's cubic with border padding clamps
its taps, not the position; AffineGrid puts an axis of size 1 at 0 (1 with align_corners);
RoiAlign's max mode takes the largest weighted corner of each sample (its quirk, which the
reference copies). Coordinates are computed in the data's float type (float32 for float32
data), as onnxruntime does. Working arrays beyond an output's size are held to
celosia.limits before they are allocated (``_check_work``).
"""

from __future__ import annotations

import math

import numpy as np

from ...limits import max_bytes
from .ir import NodeError, TensorType
from .windows import pool_output_shape, windows

__all__ = ["KERNELS", "SHAPE_RULES", "nms_runtime_types"]


def _check_work(nbytes: int, what: str, fix: str) -> None:
    """Refuse a kernel's working array larger than celosia.limits allows (a ValueError, so
    that the executor names the node) before it is allocated."""
    limit = max_bytes()
    if nbytes > limit:
        raise ValueError(f"{what} needs {nbytes:,} bytes, more than the limit of {limit:,}; "
                         f"{fix}, or raise the limit with CELOSIA_MAX_BYTES=<bytes>")


def _float_type(*arrays):
    """The float type coordinates are computed in: float64 if any operand is, else
    float32."""
    return np.float64 if any(a.dtype == np.float64 for a in arrays) else np.float32


# ---- GridSample and AffineGrid ---------------------------------------------------------------

_CUBIC_A = -0.75  # onnxruntime's and PyTorch's cubic convolution coefficient


def _cubic_weights(t):
    """The four weights of positions floor-1 .. floor+2 at fraction ``t`` (Keys)."""
    a = t.dtype.type(_CUBIC_A)
    one, two = t.dtype.type(1), t.dtype.type(2)
    u, v, w = t + one, one - t, two - t
    return [((a * u - 5 * a) * u + 8 * a) * u - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + one,
            ((a + 2) * v - (a + 3)) * v * v + one,
            ((a * w - 5 * a) * w + 8 * a) * w - 4 * a]


def _reflect(x, lo, hi):
    """Reflect ``x`` by the near border until it lies in [lo, hi] (onnxruntime's
    GsReflect)."""
    f = x.dtype.type
    span = f(hi - lo)
    if span <= 0:
        return np.full_like(x, f(lo))
    below, above = x < lo, x > hi
    d = np.where(below, f(lo) - x, x - f(hi))
    n = np.trunc(d / span)
    r = d - n * span
    even = np.fmod(n, 2) == 0
    low_side = np.where(even, f(lo) + r, f(hi) - r)
    high_side = np.where(even, f(hi) - r, f(lo) + r)
    return np.where(below, low_side, np.where(above, high_side, x))


def _pixel_index(i, size, padding, lo, hi):
    """(index to read, whether it reads a pixel) of integer positions ``i`` along an axis
    of ``size``: zeros reads nothing outside, border clamps, reflection reflects."""
    if padding == "zeros":
        inside = (i >= 0) & (i < size)
        return np.clip(i, 0, size - 1), inside
    if padding == "border":
        return np.clip(i, 0, size - 1), None
    r = _reflect(i.astype(np.float64), lo, hi)
    return np.clip(np.trunc(r).astype(np.int64), 0, size - 1), None


def grid_sample(attrs, x, grid):
    """ONNX GridSample, N-d: X [N, C, *D], grid [N, *D_out, nd] whose last axis holds the
    coordinates innermost dimension first (x, y, z) in [-1, 1]."""
    nd = x.ndim - 2
    if grid.ndim != nd + 2 or grid.shape[-1] != nd or grid.shape[0] != x.shape[0]:
        raise ValueError(f"grid of shape {list(grid.shape)} does not suit the input of shape "
                         f"{list(x.shape)}: it must be [N, *output sizes, {nd}] with the "
                         "input's N")
    mode, padding = attrs["mode"], attrs["padding_mode"]
    aligned = bool(attrs["align_corners"])
    ft = _float_type(x, grid)
    f = ft
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    out_spatial = grid.shape[1:-1]
    g = grid.astype(ft, copy=False)
    # One list of taps (index, weight, inside) per input axis, axis 0 first.
    axes_taps = []
    for k, size in enumerate(sizes):
        coord = g[..., nd - 1 - k]
        coord = np.where(np.isfinite(coord), coord, f(-1e9))  # NaN/inf: far outside
        if aligned:
            pos = (coord + f(1)) / f(2) * f(size - 1)
            lo, hi = 0.0, size - 1.0
        else:
            pos = ((coord + f(1)) * f(size) - f(1)) / f(2)
            lo, hi = -0.5, size - 0.5
        pos = np.clip(pos, f(-1e9), f(1e9)).astype(ft, copy=False)
        if mode == "nearest":
            pos = np.rint(pos)
        outside = (pos < lo) | (pos > hi)
        if padding == "border" and mode != "cubic":
            # (onnxruntime's cubic keeps the position and clamps each of its four taps)
            pos = np.where(outside, np.clip(pos, f(0), f(size - 1)), pos)
        elif padding == "reflection":
            pos = np.where(outside, _reflect(pos, lo, hi), pos)
        if mode == "nearest":
            base = pos.astype(np.int64)
            offsets, weights = [0], [None]
        else:
            base = np.floor(pos)
            t = (pos - base).astype(ft)
            base = base.astype(np.int64)
            if mode == "linear":
                offsets, weights = [0, 1], [f(1) - t, t]
            else:
                offsets, weights = [-1, 0, 1, 2], _cubic_weights(t)
        taps = []
        for off, w in zip(offsets, weights):
            idx, inside = _pixel_index(base + off, size, padding, lo, hi)
            taps.append((idx, w, inside))
        axes_taps.append(taps)
    batch = np.arange(n).reshape((n,) + (1,) * len(out_spatial))
    # [N * prod(D), C]: each tap is one take of whole rows by a flat index
    rows = np.ascontiguousarray(np.moveaxis(x, 1, -1)).reshape(-1, c)
    y = np.zeros((n, *out_spatial, c), ft)
    for combo in np.ndindex(*(len(t) for t in axes_taps)):
        taps = [axes_taps[k][j] for k, j in enumerate(combo)]
        flat = batch
        for (idx, _, _), size in zip(taps, sizes):
            flat = flat * size + idx
        v = np.take(rows, flat.reshape(-1), axis=0).reshape(y.shape).astype(ft, copy=False)
        weight, mask = None, None
        for _, w, inside in taps:
            if w is not None:
                weight = w if weight is None else weight * w
            if inside is not None:
                mask = inside if mask is None else mask & inside
        if mask is not None:
            weight = mask.astype(ft) if weight is None else np.where(mask, weight, f(0))
        y += v if weight is None else v * weight[..., None]
    return np.ascontiguousarray(np.moveaxis(y, -1, 1)).astype(x.dtype, copy=False)


def _base_coordinates(size, aligned, ft):
    """The normalized coordinates of each position along an axis of ``size``. A size of 1
    gets 0, or 1 with align_corners, as onnxruntime makes it (its linspace from -1 to 1 of
    one point is the end; PyTorch gives 0, onnx's reference -1)."""
    i = np.arange(size, dtype=ft)
    if size == 1:
        return np.full(1, 1 if aligned else 0, ft)
    if aligned:
        return -1 + 2 * i / ft(size - 1)
    return (2 * i + 1) / ft(size) - 1


def affine_grid(attrs, theta):
    """ONNX AffineGrid: theta [N, 2, 3] (2-D) or [N, 3, 4] (3-D) and ``size`` [N, C, *D] ->
    the grid [N, *D, nd] of theta applied to (x, y[, z], 1)."""
    size = attrs["size"]
    nd = len(size) - 2
    if nd not in (2, 3) or theta.shape != (size[0], nd, nd + 1):
        raise ValueError(f"theta of shape {list(theta.shape)} and size {list(size)} do not "
                         "match: 2-D takes theta [N, 2, 3] and size [N, C, H, W], 3-D theta "
                         "[N, 3, 4] and size [N, C, D, H, W]")
    ft = theta.dtype.type if theta.dtype.kind == "f" else np.float32
    spatial = size[2:]
    axes = [_base_coordinates(s, attrs["align_corners"], ft) for s in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # D, H, W order
    base = np.stack([*mesh[::-1], np.ones(tuple(spatial), ft)], axis=-1)  # x, y[, z], 1
    flat = base.reshape(-1, nd + 1)
    grid = np.matmul(flat, np.swapaxes(theta.astype(ft, copy=False), 1, 2))  # [N, P, nd]
    return grid.reshape(size[0], *spatial, nd).astype(theta.dtype, copy=False)


# ---- detection: NonMaxSuppression, RoiAlign, MaxRoiPool --------------------------------------


def _scalar_input(v, default, what):
    if v is None or np.size(v) == 0:
        return default
    if np.size(v) != 1:
        raise ValueError(f"{what} must hold one value, not a tensor of shape "
                         f"{list(np.shape(v))}")
    return np.reshape(v, ())[()]


def _corners(boxes, center):
    """(y_min, x_min, y_max, x_max) of boxes given as [y1, x1, y2, x2] (any two opposite
    corners) or, with ``center``, [x_center, y_center, width, height]."""
    if center:
        half_w, half_h = boxes[:, 2] / 2, boxes[:, 3] / 2
        return (boxes[:, 1] - half_h, boxes[:, 0] - half_w,
                boxes[:, 1] + half_h, boxes[:, 0] + half_w)
    y1, x1, y2, x2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)


def _suppressed(k, rest, corners, areas, threshold):
    """Whether each box of ``rest`` overlaps box ``k`` (index arrays that broadcast) by an
    IoU above ``threshold`` (onnxruntime's rule: empty boxes and empty intersections never
    suppress)."""
    y0, x0, y1, x1 = corners
    zero = areas.dtype.type(0)
    h = np.maximum(np.minimum(y1[k], y1[rest]) - np.maximum(y0[k], y0[rest]), zero)
    w = np.maximum(np.minimum(x1[k], x1[rest]) - np.maximum(x0[k], x0[rest]), zero)
    inter = h * w
    union = areas[k] + areas[rest] - inter
    ok = (inter > 0) & (areas[k] > 0) & (areas[rest] > 0) & (union > 0)
    with np.errstate(all="ignore"):
        iou = inter / np.where(ok, union, 1)
    return ok & (iou > threshold)


# Candidates tested at once against the remaining ones (a [block, remaining] matrix), and
# the most elements such a matrix may have (fewer candidates per block when many remain).
_NMS_BLOCK = 64
_NMS_MATRIX = 1 << 20


def _greedy(order, limit, corners, areas, threshold):
    """The boxes kept from ``order`` (by falling score): each one not suppressed by an
    earlier kept one, up to ``limit``. The next ``_NMS_BLOCK`` candidates (fewer when a
    [block, remaining] matrix would pass ``_NMS_MATRIX`` elements) are tested against all
    remaining ones in one step; which of them are kept is then decided in order among
    themselves (the earlier blocks' kept boxes already removed what they suppress), and
    every remaining box a kept one suppresses goes."""
    kept = []
    while order.size and len(kept) < limit:
        head = order[:max(1, min(_NMS_BLOCK, _NMS_MATRIX // order.size))]
        suppresses = _suppressed(head[:, None], order[None, :], corners, areas, threshold)
        alive = np.ones(head.size, bool)
        chosen = []
        for i in range(head.size):
            if alive[i]:
                chosen.append(i)
                kept.append(int(head[i]))
                if len(kept) == limit:
                    return kept
                alive &= ~suppresses[i, :head.size]
        gone = suppresses[chosen].any(axis=0)
        gone[:head.size] = True
        order = order[~gone]
    return kept


def non_max_suppression(attrs, boxes, scores, max_out=None, iou=None, score_min=None):
    """ONNX NonMaxSuppression: per batch and class, greedily keep the highest-scoring box
    and drop the boxes overlapping it by IoU > iou_threshold, up to
    max_output_boxes_per_class; boxes whose score is not above score_threshold (if given)
    are never candidates. Output int64 [selected, 3] of (batch, class, box), by batch,
    class, then selection order; ties in score go to the lower box index."""
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(f"boxes of shape {list(boxes.shape)} must be [batches, boxes, 4]")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
            or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"scores of shape {list(scores.shape)} must be [batches, classes, "
                         f"boxes] for boxes of shape {list(boxes.shape)}")
    limit = int(_scalar_input(max_out, 0, "max_output_boxes_per_class"))
    ft = boxes.dtype.type
    threshold = ft(_scalar_input(iou, 0.0, "iou_threshold"))
    if not 0 <= threshold <= 1:
        raise ValueError(f"iou_threshold = {threshold} must be in [0, 1]")
    floor = _scalar_input(score_min, None, "score_threshold")
    rows = []
    if limit > 0:
        for b in range(boxes.shape[0]):
            corners = _corners(boxes[b], attrs.get("center_point_box", 0))
            areas = (corners[2] - corners[0]) * (corners[3] - corners[1])
            for c in range(scores.shape[1]):
                s = scores[b, c]
                candidates = np.arange(s.shape[0])
                if floor is not None:
                    candidates = candidates[s > s.dtype.type(floor)]
                order = candidates[np.argsort(-s[candidates], kind="stable")]
                rows += [(b, c, k) for k in _greedy(order, limit, corners, areas, threshold)]
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


_NMS_SCALARS = ("max_output_boxes_per_class", "iou_threshold", "score_threshold")


def nms_runtime_types(node, types, values):
    """NonMaxSuppression's output in run-time form: its count of selected boxes is only
    known when it runs. Its limit and thresholds must be single values (what their sizes
    already say is refused here, at import)."""
    for name, t in zip(_NMS_SCALARS, types[2:]):
        if t is not None and t.static and math.prod(t.shape) > 1:
            raise NodeError(node, f"{name} is {t} but must hold one value; give a scalar or "
                                  "a one-element tensor")
    return [TensorType("int64", (None, 3))]


def _roi_batches(batch, n, what):
    batch = np.asarray(batch).astype(np.int64).reshape(-1)
    bad = batch[(batch < 0) | (batch >= n)]
    if bad.size:
        raise ValueError(f"{what} {int(bad[0])} is out of range for an input of {n} images; "
                         "give indices in [0, N)")
    return batch


def roi_align(attrs, x, rois, batch_indices):
    """ONNX RoiAlign (onnxruntime's algorithm): per region and output cell, the average
    (or the maximum) of bilinear samples on a grid of sampling_ratio (or ceil(bin size))
    points per axis; ``half_pixel`` shifts the region by half a pixel,
    ``output_half_pixel`` (opset 10's meaning) does not and makes it at least 1 x 1. The
    average is two small matrix products per region (``_separable_mean``); the maximum
    gathers every sample's four corners."""
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4:
        raise ValueError(f"input {list(x.shape)} must be 4-D and rois {list(rois.shape)} "
                         "[num_rois, 4]")
    if np.shape(batch_indices) != (rois.shape[0],):
        raise ValueError(f"batch_indices of shape {list(np.shape(batch_indices))} must have "
                         f"one index per region ({rois.shape[0]})")
    n, c, height, width = x.shape
    oh, ow = attrs["output_height"], attrs["output_width"]
    ratio, mode = attrs["sampling_ratio"], attrs["mode"]
    half = attrs["coordinate_transformation_mode"] == "half_pixel"
    ft = _float_type(x, rois)
    f = ft
    batch = _roi_batches(batch_indices, n, "batch index")
    r = rois.astype(ft, copy=False) * f(attrs["spatial_scale"]) - f(0.5 if half else 0.0)
    y = np.zeros((rois.shape[0], c, oh, ow), ft)
    # channels last: each sample's gather reads one contiguous row of C values
    xt = np.ascontiguousarray(np.moveaxis(x, 1, -1)).astype(ft, copy=False)
    for k in range(rois.shape[0]):
        start_w, start_h, end_w, end_h = r[k]
        roi_w, roi_h = end_w - start_w, end_h - start_h
        if not half:
            roi_w, roi_h = max(roi_w, f(1)), max(roi_h, f(1))
        bin_h, bin_w = roi_h / f(oh), roi_w / f(ow)
        grid_h = ratio if ratio > 0 else int(np.ceil(roi_h / f(oh)))
        grid_w = ratio if ratio > 0 else int(np.ceil(roi_w / f(ow)))
        if grid_h <= 0 or grid_w <= 0:
            continue  # an empty region: zeros
        count = f(max(grid_h * grid_w, 1))
        _check_work(8 * (oh * grid_h + ow * grid_w) * np.dtype(ft).itemsize,
                    f"region {k}'s {oh * grid_h} x {ow * grid_w} sample positions",
                    "lower sampling_ratio (or the regions' size)")
        ys = (start_h + np.arange(oh, dtype=ft)[:, None] * bin_h
              + (np.arange(grid_h, dtype=ft)[None, :] + f(0.5)) * bin_h / f(grid_h))
        xs = (start_w + np.arange(ow, dtype=ft)[:, None] * bin_w
              + (np.arange(grid_w, dtype=ft)[None, :] + f(0.5)) * bin_w / f(grid_w))
        (y_lo, y_hi, ly, y_ok), (x_lo, x_hi, lx, x_ok) = (
            _bilinear_axis(ys, height, ft), _bilinear_axis(xs, width, ft))
        img = xt[batch[k]]
        if mode == "avg":
            s = _separable_mean(img, (y_lo, y_hi, ly, y_ok), (x_lo, x_hi, lx, x_ok), ft)
            if s is not None:
                y[k] = s / count
                continue
        _check_work(5 * oh * grid_h * ow * grid_w * c * np.dtype(ft).itemsize,
                    f"region {k}'s {oh * grid_h} x {ow * grid_w} bilinear samples",
                    "lower sampling_ratio (or the regions' size)")
        # sample [oh, gh, ow, gw]
        ok = y_ok[:, :, None, None] & x_ok[None, None, :, :]
        hy, hx = f(1) - ly, f(1) - lx
        corners = []
        for yi, wy in ((y_lo, hy), (y_hi, ly)):
            for xi, wx in ((x_lo, hx), (x_hi, lx)):
                w = np.where(ok, wy[:, :, None, None] * wx[None, None, :, :], f(0))
                v = img[yi[:, :, None, None], xi[None, None, :, :]]
                corners.append(w[..., None] * v)  # [oh, gh, ow, gw, C]
        if mode == "avg":
            s = ((corners[0] + corners[1]) + corners[2]) + corners[3]
            y[k] = np.moveaxis(s.sum(axis=(1, 3)) / count, -1, 0)
        else:
            m = np.maximum(np.maximum(np.maximum(corners[0], corners[1]), corners[2]),
                           corners[3])
            y[k] = np.moveaxis(m.max(axis=(1, 3)), -1, 0)
    return y.astype(x.dtype, copy=False)


def _axis_weights(lo, hi, frac, ok, size, ft):
    """[cells, size]: the weight of each input position in each output cell's samples
    along one axis (the two bilinear weights of each sample, 0 for a sample that reads
    nothing)."""
    cells = lo.shape[0]
    a = np.zeros((cells, size), ft)
    cell = np.broadcast_to(np.arange(cells)[:, None], lo.shape)
    np.add.at(a, (cell, lo), np.where(ok, ft(1) - frac, ft(0)))
    np.add.at(a, (cell, hi), np.where(ok, frac, ft(0)))
    return a


def _separable_mean(img, y_axis, x_axis, ft):
    """The sum over each cell's bilinear samples of img [H, W, C] as two products with the
    per-axis weights (the weights of a sample are a product of one per axis), over the
    rows and columns the samples touch: [C, cells y, cells x]. None where that part of
    the image is not finite (a weight of 0 would meet an infinity onnxruntime never
    reads)."""
    wy = _axis_weights(*y_axis, img.shape[0], ft)
    wx = _axis_weights(*x_axis, img.shape[1], ft)
    rows, cols = np.flatnonzero(wy.any(axis=0)), np.flatnonzero(wx.any(axis=0))
    if not rows.size or not cols.size:
        return None
    h0, h1, w0, w1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    part = img[h0:h1, w0:w1]
    if not np.isfinite(part).all():
        return None
    t = np.tensordot(wy[:, h0:h1], part, axes=(1, 0))  # [cells y, w, C]
    return np.tensordot(wx[:, w0:w1], t, axes=(1, 1)).transpose(2, 1, 0)


def _bilinear_axis(p, size, ft):
    """(low index, high index, fraction, in range) of sample positions ``p`` along an axis
    of ``size`` (RoiAlign's rule: a sample beyond [-1, size] reads nothing, one in
    [-1, 0) reads the border)."""
    f = ft
    ok = (p >= f(-1)) & (p <= f(size))
    q = np.maximum(p, f(0))
    lo = np.trunc(q).astype(np.int64)
    at_end = lo >= size - 1
    lo = np.where(at_end, size - 1, lo)
    hi = np.where(at_end, size - 1, lo + 1)
    q = np.where(at_end, lo.astype(ft), q)
    lo, hi = np.clip(lo, 0, size - 1), np.clip(hi, 0, size - 1)
    return lo, hi, (q - lo).astype(ft), ok


def _c_int(v) -> int:
    """A float converted to a C int as x86 does it: out of range (or NaN) gives INT_MIN,
    as onnxruntime's kernels get for boxes far outside any image."""
    v = float(v)
    return int(v) if math.isfinite(v) and -2.0**31 <= v < 2.0**31 else -2**31


def _wrap32(v: int) -> int:
    """C int arithmetic: the result wrapped to 32 bits."""
    return (v + 2**31) % 2**32 - 2**31


def max_roi_pool(attrs, x, rois):
    """ONNX MaxRoiPool (onnxruntime's algorithm): rois [num_rois, 5] of (batch, x1, y1,
    x2, y2), rounded after scaling; each output cell the maximum of its bin (0 for an
    empty bin). Its integer arithmetic is C's (32 bits), so that boxes far outside the
    image pool what onnxruntime pools."""
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5:
        raise ValueError(f"input {list(x.shape)} must be 4-D and rois {list(rois.shape)} "
                         "[num_rois, 5]")
    n, c, height, width = x.shape
    ph, pw = attrs["pooled_shape"]
    scale = np.float32(attrs["spatial_scale"])
    batch = _roi_batches(rois[:, 0], n, "batch index (rois[:, 0])")
    y = np.zeros((rois.shape[0], c, ph, pw), x.dtype)
    for k in range(rois.shape[0]):
        # std::round (half away from zero), then C's conversion to int
        with np.errstate(all="ignore"):
            x1, y1, x2, y2 = (_c_int(np.sign(v) * np.floor(np.abs(v) + np.float32(0.5)))
                              for v in (rois[k, 1:].astype(np.float32) * scale))
        rh, rw = max(_wrap32(y2 - y1 + 1), 1), max(_wrap32(x2 - x1 + 1), 1)
        bh, bw = np.float32(rh) / np.float32(ph), np.float32(rw) / np.float32(pw)
        for i in range(ph):
            h0 = min(max(_wrap32(_c_int(np.floor(np.float32(i) * bh)) + y1), 0), height)
            h1 = min(max(_wrap32(_c_int(np.ceil(np.float32(i + 1) * bh)) + y1), 0), height)
            for j in range(pw):
                w0 = min(max(_wrap32(_c_int(np.floor(np.float32(j) * bw)) + x1), 0), width)
                w1 = min(max(_wrap32(_c_int(np.ceil(np.float32(j + 1) * bw)) + x1), 0),
                         width)
                if h1 > h0 and w1 > w0:
                    y[k, :, i, j] = x[batch[k], :, h0:h1, w0:w1].max(axis=(1, 2))
    return y


# ---- normalizations and pools ----------------------------------------------------------------


def lrn(attrs, x):
    """ONNX LRN: x / (bias + alpha / size * (sum of x^2 over the size channels around
    each one)) ^ beta."""
    if x.ndim < 3:
        raise ValueError(f"input of shape {list(x.shape)} must have rank >= 3 ([N, C, ...])")
    size = attrs["size"]
    ft = _float_type(x)
    f = ft
    sq = np.square(x.astype(ft, copy=False))
    c = x.shape[1]
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    # channels past the ends add nothing: pad by at most C on each side
    before, after = min(before, c), min(after, c)
    pad = [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2)
    padded = np.pad(sq, pad)
    window = padded[:, 0:c].copy()
    for k in range(1, before + after + 1):  # in channel order, as onnxruntime sums
        window += padded[:, k:k + c]
    scale = f(attrs["bias"]) + f(attrs["alpha"]) / f(size) * window
    return (x.astype(ft, copy=False) / scale ** f(attrs["beta"])).astype(x.dtype, copy=False)


def _lp(s, p):
    return np.sqrt(s) if p == 2 else np.power(s, 1.0 / p)


def lp_pool(attrs, x):
    """ONNX LpPool: (sum of |x|^p over each window) ^ (1/p); the padding adds nothing."""
    kernel = attrs["kernel_shape"]
    out = pool_output_shape(x.shape[2:], kernel, attrs["strides"], attrs["dilations"],
                            attrs["pads"], attrs["ceil_mode"])
    if min(out, default=1) < 1:
        raise ValueError(f"kernel {kernel} does not fit the input of shape {list(x.shape)}")
    p = attrs["p"]
    nd = len(kernel)
    _check_work(math.prod(x.shape[:2]) * x.dtype.itemsize * math.prod(
        x.shape[2 + i] + attrs["pads"][i] + attrs["pads"][i + nd] for i in range(nd)),
        "the padded input", "lower the pads")
    a = np.abs(x)
    powered = np.square(a) if p == 2 else a if p == 1 else np.power(a, x.dtype.type(p))
    win = windows(powered, kernel, attrs["strides"], attrs["dilations"], attrs["pads"], out, 0)
    s = win.sum(axis=tuple(range(2 + len(kernel), 2 + 2 * len(kernel))))
    return np.ascontiguousarray(_lp(s, p) if p != 1 else s).astype(x.dtype, copy=False)


def global_lp_pool(attrs, x):
    p = attrs["p"]
    a = np.abs(x)
    powered = np.square(a) if p == 2 else a if p == 1 else np.power(a, x.dtype.type(p))
    s = powered.sum(axis=tuple(range(2, x.ndim)), keepdims=True)
    return (_lp(s, p) if p != 1 else s).astype(x.dtype, copy=False)


def mean_variance_normalization(attrs, x):
    """ONNX MeanVarianceNormalization, as its function body computes it:
    (x - mean) / (sqrt(mean(x^2) - mean^2) + 1e-9) over ``axes``."""
    axes = tuple(attrs["axes"])
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean(np.square(x), axis=axes, keepdims=True) - np.square(mean)
    return ((x - mean) / (np.sqrt(var) + x.dtype.type(1e-9))).astype(x.dtype, copy=False)


# ---- MaxUnpool, Col2Im, CenterCropPad, DeformConv --------------------------------------------


def max_unpool(attrs, x, indices):
    """ONNX MaxUnpool: zeros of ``output_shape`` with x's values at the flat ``indices``
    MaxPool gave (indices into the whole output tensor, as onnxruntime reads them)."""
    shape = tuple(attrs["output_shape"])
    if indices.shape != x.shape:
        raise ValueError(f"indices of shape {list(indices.shape)} must have the input's "
                         f"shape {list(x.shape)}")
    total = math.prod(shape)
    flat = indices.astype(np.int64).reshape(-1)
    bad = flat[(flat < 0) | (flat >= total)]
    if bad.size:
        raise ValueError(f"index {int(bad[0])} is out of range for the output of shape "
                         f"{list(shape)}; the indices must come from the MaxPool this undoes")
    y = np.zeros(total, x.dtype)
    y[flat] = x.reshape(-1)
    return y.reshape(shape)


def col2im_blocks(image, block, dilations, pads, strides):
    """The count of block positions along each image axis."""
    nd = len(image)
    return [(image[i] + pads[i] + pads[i + nd] - (dilations[i] * (block[i] - 1) + 1))
            // strides[i] + 1 for i in range(nd)]


def col2im(attrs, x):
    """ONNX Col2Im: the sum of the columns [N, C * prod(block), L] back into images
    [N, C, *image_shape] (the inverse of im2col's gather, overlaps added)."""
    image, block = attrs["image_shape"], attrs["block_shape"]
    dil, pads, strides = attrs["dilations"], attrs["pads"], attrs["strides"]
    nd = len(image)
    counts = col2im_blocks(image, block, dil, pads, strides)
    kprod = math.prod(block)
    if x.ndim != 3 or x.shape[1] % kprod or min(counts) < 1 or x.shape[2] != math.prod(counts):
        raise ValueError(f"input of shape {list(x.shape)} does not hold the columns of "
                         f"blocks {list(block)} over images {list(image)} (it must be "
                         f"[N, C * {kprod}, {math.prod(max(c, 0) for c in counts)}])")
    n, c = x.shape[0], x.shape[1] // kprod
    cols = x.reshape(n, c, *block, *counts)
    padded = [image[i] + pads[i] + pads[i + nd] for i in range(nd)]
    _check_work(n * c * math.prod(padded) * x.dtype.itemsize, f"the padded images {padded}",
                "lower the pads")
    y = np.zeros((n, c, *padded), x.dtype)
    for pos in np.ndindex(*block):
        idx = tuple(slice(pos[i] * dil[i], pos[i] * dil[i] + (counts[i] - 1) * strides[i] + 1,
                          strides[i]) for i in range(nd))
        y[(slice(None), slice(None), *idx)] += cols[(slice(None), slice(None), *pos)]
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(nd))
    return np.ascontiguousarray(y[(slice(None), slice(None), *crop)])


def center_crop_pad(attrs, x):
    """ONNX CenterCropPad: each of ``axes`` cropped or zero-padded to ``shape``, centred
    (an odd difference puts the extra element at the end)."""
    y = x
    for axis, size in zip(attrs["axes"], attrs["shape"]):
        have = y.shape[axis]
        if size < have:
            start = (have - size) // 2
            y = np.take(y, np.arange(start, start + size), axis=axis)
        elif size > have:
            before = (size - have) // 2
            widths = [(0, 0)] * y.ndim
            widths[axis] = (before, size - have - before)
            y = np.pad(y, widths)
    return np.ascontiguousarray(y)


def deform_conv(attrs, x, w, offset, b=None, mask=None):
    """ONNX DeformConv (2-D): a convolution whose every kernel tap reads the input at its
    position plus a learned offset, bilinearly (zero outside the input), times the mask
    (if given)."""
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"input {list(x.shape)} and weight {list(w.shape)} must be 4-D "
                         "(celosia takes 2-D DeformConv)")
    n, c, height, width = x.shape
    oc, cg, kh, kw = w.shape
    g, og = attrs["group"], attrs["offset_group"]
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilations"]
    pt, pl = attrs["pads"][0], attrs["pads"][1]
    oh, ow = pool_output_shape_2d(x.shape[2:], (kh, kw), attrs)
    if c != cg * g or oc % g or c % og:
        raise ValueError(f"input channels {c}, weight {list(w.shape)}, group {g} and "
                         f"offset_group {og} do not fit together")
    taps = kh * kw
    if offset.shape != (n, og * 2 * taps, oh, ow):
        raise ValueError(f"offset of shape {list(offset.shape)} must be "
                         f"{[n, og * 2 * taps, oh, ow]}")
    if mask is not None and mask.shape != (n, og * taps, oh, ow):
        raise ValueError(f"mask of shape {list(mask.shape)} must be {[n, og * taps, oh, ow]}")
    ft = _float_type(x, w, offset)
    f = ft
    off = offset.astype(ft, copy=False).reshape(n, og, taps, 2, oh, ow)
    base_y = (np.arange(oh) * sh - pt)[:, None].astype(ft)
    base_x = (np.arange(ow) * sw - pl)[None, :].astype(ft)
    cpg = c // og
    _check_work(2 * n * oh * ow * c * taps * np.dtype(ft).itemsize,
                f"the {oh * ow} x {c * taps} sampled columns", "use a smaller kernel or input")
    # channels last, so that each tap's gather is [N, og, oh, ow, channels] of whole rows
    xs = np.ascontiguousarray(np.moveaxis(x.astype(ft, copy=False), 1, -1)).reshape(
        n, height, width, og, cpg)
    cols = np.zeros((n, og, oh, ow, taps, cpg), ft)
    bidx = np.arange(n)[:, None, None, None]
    gidx = np.arange(og)[None, :, None, None]
    for t in range(taps):
        i, j = divmod(t, kw)
        py = base_y + f(i * dh) + off[:, :, t, 0]  # [N, og, oh, ow]
        px = base_x + f(j * dw) + off[:, :, t, 1]
        inside = (py > -1) & (py < height) & (px > -1) & (px < width)
        y0, x0 = np.floor(py), np.floor(px)
        ly, lx = py - y0, px - x0
        y0, x0 = y0.astype(np.int64), x0.astype(np.int64)
        acc = cols[:, :, :, :, t]
        for yi, wy in ((y0, f(1) - ly), (y0 + 1, ly)):
            for xi, wx in ((x0, f(1) - lx), (x0 + 1, lx)):
                ok = inside & (yi >= 0) & (yi < height) & (xi >= 0) & (xi < width)
                v = xs[bidx, np.clip(yi, 0, height - 1), np.clip(xi, 0, width - 1), gidx]
                acc += v * np.where(ok, wy * wx, f(0))[..., None]
        if mask is not None:
            acc *= mask.astype(ft, copy=False).reshape(n, og, taps, oh, ow)[:, :, t, :, :,
                                                                            None]
    # im2col rows [N, P, C * taps] (channel-major, as the weight's [cg, kh, kw]), per group
    cols = cols.transpose(0, 2, 3, 1, 5, 4).reshape(n, oh * ow, g, cg * taps)
    wg = w.astype(ft, copy=False).reshape(g, oc // g, cg * taps)
    y = np.matmul(cols.transpose(0, 2, 1, 3), wg.transpose(0, 2, 1))  # [N, g, P, oc/g]: BLAS
    y = y.transpose(0, 1, 3, 2).reshape(n, oc, oh, ow)
    if b is not None:
        y = y + b.astype(ft, copy=False).reshape(1, -1, 1, 1)
    return y.astype(x.dtype, copy=False)


def pool_output_shape_2d(in_shape, kernel, attrs):
    out = pool_output_shape(in_shape, kernel, attrs["strides"], attrs["dilations"],
                            attrs["pads"])
    if min(out) < 1:
        raise ValueError(f"kernel {list(kernel)} does not fit the input sizes {list(in_shape)}")
    return out


KERNELS = {
    "GridSample": grid_sample,
    "AffineGrid": affine_grid,
    "NonMaxSuppression": non_max_suppression,
    "RoiAlign": roi_align,
    "MaxRoiPool": max_roi_pool,
    "LRN": lrn,
    "LpPool": lp_pool,
    "GlobalLpPool": global_lp_pool,
    "MeanVarianceNormalization": mean_variance_normalization,
    "MaxUnpool": max_unpool,
    "Col2Im": col2im,
    "CenterCropPad": center_crop_pad,
    "DeformConv": deform_conv,
}
SHAPE_RULES: dict = {}
