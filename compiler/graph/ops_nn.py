"""numpy definitions of neural-network operators beyond ops.py's: normalizations
(LayerNormalization, GroupNormalization, InstanceNormalization, LpNormalization), the
activations of transformers and newer CNNs (Gelu, Mish, Celu, ThresholdedRelu, Shrink),
Hardmax, and ConvTranspose. ops.py merges ``KERNELS`` and ``SHAPE_RULES`` into its tables.

Attributes are canonical (frontend/canonical.py): ConvTranspose has explicit
``kernel_shape, strides, pads, dilations, output_padding, group`` (``output_shape`` and
``auto_pad`` resolved into pads); GroupNormalization's scale and bias are per channel (the
opset-21 meaning; opset 18's per-group ones are repeated at import); ``stash_type`` is the
numpy name of the type the normalizations compute in.
"""

from __future__ import annotations

import math

import numpy as np

from .ir import NodeError, TensorType
from .ops_math import erf

__all__ = ["KERNELS", "SHAPE_RULES", "conv_transpose", "conv_transpose_output_size"]


# ---- normalizations ---------------------------------------------------------------------


def _normalize(x, axes, eps):
    """(x - mean) / sqrt(var + eps) over ``axes``, with the mean and 1/std (keepdims), in
    x's type, in the order of ONNX's function bodies (reciprocal of the square root)."""
    mean = x.mean(axis=axes, keepdims=True)
    d = x - mean
    var = (d * d).mean(axis=axes, keepdims=True)
    inv = np.reciprocal(np.sqrt(var + x.dtype.type(eps)))
    return d * inv, mean, inv


def _channel(v, rank):
    """A per-channel vector shaped to broadcast over [N, C, ...]."""
    return v.reshape((1, -1) + (1,) * (rank - 2))


def layer_norm(attrs, x, scale, bias=None):
    axis = attrs["axis"]
    stash = np.dtype(attrs["stash_type"])
    y, mean, inv = _normalize(x.astype(stash, copy=False), tuple(range(axis, x.ndim)),
                              attrs["epsilon"])
    y = y.astype(x.dtype, copy=False) * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype, copy=False), mean, inv


def group_norm(attrs, x, scale, bias):
    g = attrs["num_groups"]
    n, c = x.shape[:2]
    if g < 1 or c % g:
        raise ValueError(f"{c} channels do not split into num_groups={g} groups")
    grouped = x.astype(attrs["stash_type"], copy=False).reshape(n, g, -1)
    y, _, _ = _normalize(grouped, (2,), attrs["epsilon"])
    y = y.reshape(x.shape).astype(x.dtype, copy=False)
    return (y * _channel(scale, x.ndim) + _channel(bias, x.ndim)).astype(x.dtype, copy=False)


def instance_norm(attrs, x, scale, bias):
    y, _, _ = _normalize(x, tuple(range(2, x.ndim)), attrs["epsilon"])
    return (y * _channel(scale, x.ndim) + _channel(bias, x.ndim)).astype(x.dtype, copy=False)


def lp_norm(attrs, x):
    axis, p = attrs["axis"], attrs["p"]
    if p == 1:
        norm = np.abs(x).sum(axis=axis, keepdims=True)
    else:
        norm = np.sqrt((x * x).sum(axis=axis, keepdims=True))
    return np.where(norm == 0, 0, x / norm).astype(x.dtype, copy=False)  # 0 stays 0


def hardmax(attrs, x):
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    axis = attrs["axis"]
    y = np.zeros(x.shape, x.dtype)
    if x.size:
        np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=axis), axis), 1, axis=axis)
    return y


# ---- activations ------------------------------------------------------------------------


def gelu(attrs, x):
    half, one = x.dtype.type(0.5), x.dtype.type(1)
    if attrs.get("approximate", "none") == "tanh":
        inner = x.dtype.type(math.sqrt(2 / math.pi)) * (x + x.dtype.type(0.044715) * x * x * x)
        return half * x * (one + np.tanh(inner))
    return half * x * (one + erf(x * x.dtype.type(1 / math.sqrt(2))))


def celu(attrs, x):
    # exp(x / alpha) - 1 as ONNX's function body and onnxruntime compute it (not expm1,
    # which differs where x / alpha is tiny: a huge alpha).
    alpha, one = x.dtype.type(attrs.get("alpha", 1.0)), x.dtype.type(1)
    return (np.maximum(x, 0) + np.minimum(0, alpha * (np.exp(x / alpha) - one))).astype(x.dtype)


def shrink(attrs, x):
    bias, lambd = attrs.get("bias", 0.0), attrs.get("lambd", 0.5)
    y = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
    return y.astype(x.dtype)


# ---- ConvTranspose ----------------------------------------------------------------------


def conv_transpose_output_size(in_sizes, kernel, strides, dilations, pads, output_padding):
    """ONNX: stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1 - pads."""
    nd = len(kernel)
    return [strides[i] * (in_sizes[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i]
            + 1 - pads[i] - pads[i + nd] for i in range(nd)]


def conv_transpose(attrs, x, w, b=None):
    """The gradient of a convolution: each input pixel scatters ``w``'s window into the
    output. One batched GEMM per kernel position (BLAS) adds the contributions of that
    tap at its strided positions, those inside the output only: the memory is the
    output's however large the strides or pads (a negative pad, from an output_shape
    larger than the operator makes, leaves zeros)."""
    kernel, strides, dil = attrs["kernel_shape"], attrs["strides"], attrs["dilations"]
    pads, g = attrs["pads"], attrs["group"]
    n, c, in_sizes = x.shape[0], x.shape[1], x.shape[2:]
    cg, mg = c // g, w.shape[1]
    sizes = conv_transpose_output_size(in_sizes, kernel, strides, dil, pads,
                                       attrs["output_padding"])
    out = np.zeros((n, g, mg, *sizes), x.dtype)
    # [n, g, pixels, cg] @ [g, cg, mg] for each tap.
    xt = x.reshape(n, g, cg, -1).transpose(0, 1, 3, 2)
    wg = w.reshape(g, cg, mg, *kernel)
    for tap in np.ndindex(*kernel):
        reads, writes = _tap_window(tap, in_sizes, sizes, strides, dil, pads)
        if reads is None:
            continue
        y = np.matmul(xt, wg[(slice(None),) * 3 + tap])
        y = y.transpose(0, 1, 3, 2).reshape(n, g, mg, *in_sizes)
        out[(slice(None),) * 3 + writes] += y[(slice(None),) * 3 + reads]
    y = out.reshape(n, g * mg, *sizes)
    if b is not None:
        y = y + _channel(b, x.ndim)
    return np.ascontiguousarray(y, dtype=x.dtype)


def _tap_window(tap, in_sizes, sizes, strides, dil, pads):
    """(input slices, output slices) of one kernel tap: input pixel i lands on output
    position i * stride + tap * dilation - pad_begin, kept where that is inside the
    output; (None, None) when no pixel is."""
    reads, writes = [], []
    for d, (size_in, size_out, s) in enumerate(zip(in_sizes, sizes, strides)):
        first = tap[d] * dil[d] - pads[d]
        lo = max(0, -(first // s))  # the first i with first + i * s >= 0
        hi = min(size_in, -(-(size_out - first) // s))  # past the last i inside
        if lo >= hi:
            return None, None
        reads.append(slice(lo, hi))
        writes.append(slice(first + lo * s, first + (hi - 1) * s + 1, s))
    return tuple(reads), tuple(writes)


def _broadcasts_to(shape, target) -> bool:
    return len(shape) <= len(target) and all(
        d in (1, t) for d, t in zip(shape[::-1], target[::-1]))


def _conv_transpose_types(node, types):
    x, w = types[0], types[1]
    a = node.attrs
    if len(x.shape) != len(w.shape) or len(x.shape) < 3:
        raise NodeError(node, f"input {x} and weight {w} must have the same rank (>= 3)")
    if x.shape[1] != w.shape[0] or x.shape[1] % a["group"]:
        raise NodeError(node, f"input has {x.shape[1]} channels but weight {w} (group="
                              f"{a['group']}) expects {w.shape[0]}, a multiple of the group")
    if list(w.shape[2:]) != list(a["kernel_shape"]):
        raise NodeError(node, f"kernel_shape {a['kernel_shape']} differs from the weight {w}")
    sizes = conv_transpose_output_size(x.shape[2:], a["kernel_shape"], a["strides"],
                                       a["dilations"], a["pads"], a["output_padding"])
    if min(sizes) < 1:
        raise NodeError(node, f"output size {sizes} is empty: the pads {a['pads']} crop more "
                              "than the transposed convolution produces")
    return [TensorType(x.dtype, (x.shape[0], w.shape[1] * a["group"], *sizes))]


def _instance_norm_types(node, types):
    """The input's type; scale and bias are one value per channel (the kernel would
    broadcast others into a larger output)."""
    x = types[0]
    if len(x.shape) < 3:
        raise NodeError(node, f"input {x} must be [N, C, D1, ...]")
    for t in types[1:3]:
        if t.shape != x.shape[1:2]:
            raise NodeError(node, f"scale and bias must have shape [{x.shape[1]}] (one value "
                                  f"per channel of {x}), not {t}")
    return [x]


def _layer_norm_types(node, types):
    x, axis = types[0], node.attrs["axis"]
    for t in types[1:]:
        if t is not None and not _broadcasts_to(t.shape, x.shape[axis:]):
            raise NodeError(node, f"scale or bias {t} does not broadcast to the normalized "
                                  f"shape {list(x.shape[axis:])}")
    stats = TensorType(node.attrs["stash_type"], x.shape[:axis] + (1,) * (len(x.shape) - axis))
    return [x, stats, stats][:len(node.outputs)]


KERNELS = {
    # normalizations
    "LayerNormalization": layer_norm,                       # (Y, Mean, InvStdDev)
    "GroupNormalization": group_norm,                       # per-channel scale and bias
    "InstanceNormalization": instance_norm,
    "LpNormalization": lp_norm,
    "Hardmax": hardmax,
    # activations
    "Gelu": gelu,
    "Mish": lambda a, x: (x * np.tanh(np.logaddexp(0, x))).astype(x.dtype, copy=False),
    "Celu": celu,
    "ThresholdedRelu": lambda a, x: np.where(x > a.get("alpha", 1.0), x, 0).astype(x.dtype),
    "Shrink": shrink,
    # transposed convolution (N-d, groups, output padding)
    "ConvTranspose": conv_transpose,
}

SHAPE_RULES = {"ConvTranspose": _conv_transpose_types, "LayerNormalization": _layer_norm_types,
               "InstanceNormalization": _instance_norm_types}
