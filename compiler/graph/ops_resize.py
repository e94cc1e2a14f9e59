"""numpy definition of Resize (and of Upsample, which the importer turns into a Resize):
nearest, linear and cubic interpolation, every coordinate transformation mode,
antialiasing, N-d. ops.py merges ``KERNELS`` and ``SHAPE_RULES`` into its tables.

Canonical attributes (frontend/canonical.py): ``sizes`` (the output shape) and ``scales``
(the per-axis factors the coordinate transformation uses: the given scales, or output /
input sizes) for every axis, ``roi`` (starts..., ends...) for ``tf_crop_and_resize``, and
every mode attribute explicit. The node has its data input only.

Interpolation is separable: one pass per axis whose mapping is not the identity, each
a weighted sum of a few gathered slices (1 tap nearest, 2 linear, 4 cubic, more with
antialias). For float32 data the coordinates are float32, as onnxruntime computes them,
so a nearest pick on a half-way coordinate rounds alike; where onnxruntime and onnx's
reference evaluator disagree (align_corners with a non-integral scaled size,
pytorch_half_pixel to size 1) this follows onnxruntime. Integer data is interpolated in
float64 and rounded to nearest, as the reference does (onnxruntime's uint8 path is fixed
point and truncates: up to one step lower).
"""

from __future__ import annotations

import numpy as np

from .ir import TensorType

__all__ = ["KERNELS", "SHAPE_RULES", "resize", "source_coordinates"]

F32 = np.float32


def source_coordinates(mode, out_size, in_size, scale, roi=(0.0, 1.0), dtype=F32):
    """The input coordinate of each output position along one axis, computed in
    ``dtype``."""
    f = np.dtype(dtype).type
    x = np.arange(out_size, dtype=dtype)
    s, n_in, n_out, half = f(scale), f(in_size), f(out_size), f(0.5)
    if mode == "half_pixel":
        return (x + half) / s - half
    if mode == "half_pixel_symmetric":  # half_pixel, centred when the size was rounded
        offset = n_in / f(2) * (f(1) - n_out / (s * n_in))
        return offset + (x + half) / s - half
    if mode == "pytorch_half_pixel":
        return (x + half) / s - half if out_size > 1 else np.zeros(out_size, dtype)
    if mode == "align_corners":
        return x * (n_in - 1) / (n_out - 1) if out_size > 1 else np.zeros(out_size, dtype)
    if mode == "asymmetric":
        return x / s
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / s
    if mode == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if out_size > 1:
            return start * (n_in - 1) + x * (end - start) * (n_in - 1) / (n_out - 1)
        return np.full(out_size, half * (start + end) * (n_in - 1), dtype)
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def _nearest(x, mode):
    if mode == "round_prefer_floor":
        return np.where(x - np.floor(x) == 0.5, np.floor(x), np.floor(x + 0.5))
    if mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if mode == "floor":
        return np.floor(x)
    if mode == "ceil":
        return np.ceil(x)
    raise ValueError(f"unknown nearest_mode {mode!r}")


def _cubic(t, a):
    """Keys' cubic convolution kernel with parameter ``a`` at distances ``t``."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _filter_taps(x, mode, scale, attrs):
    """(offsets [taps] from floor(x), weights [out, taps]) of linear or cubic
    interpolation at coordinates x; antialiasing widens the filter by 1/scale when
    shrinking and normalizes it."""
    base = np.floor(x)
    ratio = (x - base).astype(np.float64)
    support = 1 if mode == "linear" else 2
    stretch = min(float(scale), 1.0) if attrs.get("antialias", 0) else 1.0
    first = int(np.floor(-support / stretch)) + 1 if stretch < 1 else 1 - support
    offsets = np.arange(first, 1 - first + 1)
    t = (offsets[None, :] - ratio[:, None]) * stretch
    if mode == "linear":
        w = np.clip(1 - np.abs(t), 0, None)
    else:
        w = _cubic(t, attrs.get("cubic_coeff_a", -0.75))
    if stretch < 1:
        w = w / w.sum(axis=1, keepdims=True)
    return base.astype(np.int64), offsets, w


def _axis_taps(n_in, n_out, scale, roi, attrs, dtype):
    """(indices [out, taps], weights [out, taps] or None, outside [out] or None) of one
    axis: output position i reads sum_t weights[i, t] * x[indices[i, t]]."""
    mode = attrs["mode"]
    ctm = attrs["coordinate_transformation_mode"]
    x = source_coordinates(ctm, n_out, n_in, scale, roi, dtype)
    outside = ((x < 0) | (x > n_in - 1)) if ctm == "tf_crop_and_resize" else None
    if mode == "nearest":
        idx = _nearest(x, attrs["nearest_mode"]).astype(np.int64)[:, None]
        return np.clip(idx, 0, n_in - 1), None, outside
    if mode == "linear":  # clamped into the input first, as onnxruntime does
        x = np.clip(x, 0, max(n_in - 1, 0))
    base, offsets, w = _filter_taps(x, mode, scale, attrs)
    idx = base[:, None] + offsets[None, :]
    if attrs.get("exclude_outside", 0):  # taps outside the input get no weight
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        w = w / np.where(w.sum(axis=1, keepdims=True) == 0, 1, w.sum(axis=1, keepdims=True))
    return np.clip(idx, 0, n_in - 1), w, outside


def _is_identity(idx, w, n_in):
    if idx.shape[0] != n_in:
        return False
    rows = np.arange(n_in)[:, None]
    if w is None:
        return bool(np.all(idx == rows))
    return bool(np.all(np.where(idx == rows, w, 0).sum(axis=1) == 1)
                and np.all(np.where(idx != rows, w, 0) == 0))


def resize(attrs, x):
    sizes, scales = attrs["sizes"], attrs["scales"]
    roi = attrs.get("roi") or [0.0] * x.ndim + [1.0] * x.ndim
    # Coordinates and interpolation in float32 for float32 data (as onnxruntime), in
    # float64 for float64 and integers (as onnx's reference: exact for int32, then
    # rounded); nearest only gathers.
    coords = np.dtype(F32) if x.dtype in (np.float32, np.float16) else np.dtype(np.float64)
    work = x.dtype if attrs["mode"] == "nearest" else coords
    y = x.astype(work, copy=False)
    outside = np.zeros((1,) * x.ndim, bool)
    for axis in range(x.ndim):
        idx, w, out = _axis_taps(x.shape[axis], sizes[axis], scales[axis],
                                 (roi[axis], roi[axis + x.ndim]), attrs, coords)
        shape = [1] * x.ndim
        shape[axis] = -1
        if out is not None:
            outside = outside | out.reshape(shape)
        if x.shape[axis] == 0 or _is_identity(idx, w, x.shape[axis]):
            if x.shape[axis] != sizes[axis]:  # an empty axis stays empty
                y = np.take(y, idx[:, 0], axis=axis)
            continue
        if w is None:
            y = np.take(y, idx[:, 0], axis=axis)
            continue
        acc = None
        for t in range(idx.shape[1]):
            term = np.take(y, idx[:, t], axis=axis) * w[:, t].astype(work).reshape(shape)
            acc = term if acc is None else acc + term
        y = acc
    if outside.any():
        y = np.where(outside, work.type(attrs.get("extrapolation_value", 0.0)), y)
    if x.dtype.kind in "iu" and work != x.dtype:  # to the nearest integer, saturated
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return np.ascontiguousarray(y, dtype=x.dtype)


def _resize_types(node, types):
    return [TensorType(types[0].dtype, tuple(int(d) for d in node.attrs["sizes"]))]


KERNELS = {"Resize": resize}
SHAPE_RULES = {"Resize": _resize_types}
